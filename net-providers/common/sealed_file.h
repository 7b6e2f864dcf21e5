// Shared files whose size their owner can no longer change.
//
// A process that maps a peer's file and touches a page past the file's end dies of
// SIGBUS, and a peer can shrink (ftruncate) its own file at any time. So every file the
// stream providers share (a message ring, the region descriptors) is a memfd created
// with sealing allowed and sealed against shrinking and growing once it has its size
// (F_SEAL_SHRINK, F_SEAL_GROW), and a process maps a peer's file only after checking
// that the seal is there (the kernel keeps seals with the file: the owner cannot take
// one off). The cpu device provider does the same for HMC_ALLOC_SHAREABLE memory.
#pragma once

#include <cstdint>
#include <string>

namespace hmc_net {

// A memfd of `bytes` bytes named `name`, sealed against shrinking and growing; -1 with
// `why` when it cannot be made.
int create_sealed_memfd(const char* name, uint64_t bytes, std::string& why);

// Whether the file open on `fd` cannot shrink (F_SEAL_SHRINK). Files other than memfds
// made with sealing allowed (a /dev/shm file, a memfd without MFD_ALLOW_SEALING) cannot.
bool cannot_shrink(int fd);

// The words a refusal uses: "<what> is not sealed against shrinking (...)".
std::string not_sealed(const std::string& what);

}  // namespace hmc_net
