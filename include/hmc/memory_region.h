// MemoryRegion: memory registered as a target of one-sided puts, with a packable remote key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hmc/status.h"

namespace hmc {

namespace core {
class Registration;
}

// The packed, opaque description of a peer's region: what put() needs.
struct RemoteKey {
  std::vector<uint8_t> bytes;
};

// The registered memory must outlive its region: destroy the MemoryRegion (which
// deregisters it: later puts with its key are refused) before freeing the memory. A peer's
// put into memory freed under a live region writes wherever the address now leads: into
// another allocation made there, or, over tcp and ucx, a fault that kills this process.
// Destroying the region refuses the puts that come after it, and returns only once no
// byte of a put lands there any more (over shm, where the peer copies into this process
// itself, it waits for a copy under way: at most a few milliseconds, up to 10 s for a peer
// that stopped in the middle, then an error in the log). The peer's puts fail; to keep
// them from failing, free memory a peer may be putting into once it said it stopped.
class MemoryRegion {
 public:
  MemoryRegion();  // empty: registers nothing (defined where Registration is complete)
  explicit MemoryRegion(std::unique_ptr<core::Registration> reg);
  MemoryRegion(MemoryRegion&&) noexcept;
  MemoryRegion& operator=(MemoryRegion&&) noexcept;
  ~MemoryRegion();

  void* data() const;
  std::size_t size() const;
  // The key a peer passes to Communicator::put to write into this region.
  RemoteKey pack() const;

 private:
  std::unique_ptr<core::Registration> reg_;
};

}  // namespace hmc
