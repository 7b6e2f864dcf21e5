// Packed remote key shared by the stream providers.
//
// tcp fills magic/region/key/length; the target checks region and key against
// its table, so a forged or stale key is refused there. shm also carries the
// owner's pid, the region address and the address of the region's descriptor:
// the initiator reads the descriptor before every single-copy write, so the
// target's table stays the authority there as well: through a read-only mapping
// of the owner's descriptor memfd where the key names one (v3), else with
// process_vm_readv.
// For a region inside a shared file mapping (a memfd or /dev/shm file) shm
// adds the owner's fd on that file, the file offset of the region and the
// file's identity: the initiator maps the file and copies with memcpy, after
// checking these against the descriptor it read (v2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hmc_net {

struct Rkey {
  uint32_t magic;  // provider magic: a tcp key is not an shm key
  uint32_t version;
  uint64_t region;       // region id (slot in the owner's table)
  uint64_t key;          // random per registration
  uint64_t length;       // region length, lets the initiator refuse early
  uint64_t pid;          // shm: owner process (informational; the socket's peer pid is used)
  uint64_t addr;         // shm: region start in the owner
  uint64_t desc;         // shm: address of the region descriptor in the owner
  int64_t file_fd;       // shm: the owner's fd on the file behind the region, -1 none
  uint64_t file_offset;  // shm: file offset of the region's first byte
  uint64_t file_dev;     // shm: st_dev of that file
  uint64_t file_ino;     // shm: st_ino of that file
  int64_t desc_fd;       // shm: the owner's fd on the memfd holding the descriptor, -1 none
  uint64_t desc_offset;  // shm: where in that memfd the descriptor lies
  uint64_t desc_dev;     // shm: st_dev of that memfd
  uint64_t desc_ino;     // shm: st_ino of that memfd
};
static_assert(sizeof(Rkey) == 120);

inline constexpr uint32_t kRkeyVersion = 3;

inline bool unpack_rkey(const void* blob, size_t len, uint32_t magic, Rkey& out) {
  if (blob == nullptr || len != sizeof(Rkey)) return false;
  std::memcpy(&out, blob, sizeof(Rkey));
  return out.magic == magic && out.version == kRkeyVersion;
}

}  // namespace hmc_net
