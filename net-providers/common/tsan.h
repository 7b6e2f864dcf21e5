// ThreadSanitizer annotations for orderings it cannot see. shm's put marks live in a
// memfd that a process maps twice when both ends of a connection are in it (the kit, ranks
// as threads); ThreadSanitizer keys its clocks by address, so the mark's release in one
// mapping and its acquire through the other order nothing in its view. Both sides then
// also annotate the region's base address. No-ops in other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace hmc_net {

#if defined(__SANITIZE_THREAD__)
inline void tsan_release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }
inline void tsan_acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
#else
inline void tsan_release(const void*) {}
inline void tsan_acquire(const void*) {}
#endif

}  // namespace hmc_net
