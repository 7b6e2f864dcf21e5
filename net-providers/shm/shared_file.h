// shm's memcpy puts into regions that live in a shared file (Linux).
//
// HMC_ALLOC_SHAREABLE memory (device-providers/cpu) is a memfd mapped
// MAP_SHARED whose fd the owner keeps open, sealed against shrinking. For such a
// region the initiator of a put can map the very same pages and copy with a
// plain memcpy, which runs at about twice the speed of process_vm_writev on the
// kernels we measured. Files without that seal (a /dev/shm file, the
// application's own memfd) are not mapped: their owner could shrink them under
// the mapping, and the initiator's next copy would die of SIGBUS
// (common/sealed_file.h); puts into them use process_vm_writev, which fails
// cleanly instead.
//
// find_shared_file (the region's owner, at reg_mem): whether [ptr, ptr+len)
// lies in one writable MAP_SHARED mapping of a regular file (/proc/self/maps,
// adjacent pieces of one mapping are joined), which fd of this process is
// open on that file (/proc/self/fd, matched by st_dev and st_ino), and that
// the file is sealed against shrinking.
//
// PeerMappings (the initiator, on the io thread): one connection's cache of
// peer regions mapped here. A miss opens /proc/<pid>/fd/<fd> (same user; the
// kernel applies the ptrace access check), checks that it is a regular file
// with the identity and size the target's descriptor names and the seal, and maps the
// region's pages MAP_SHARED. Entries are keyed by region id and key, at most
// one per region id (a new registration of the slot replaces the old one),
// at most kMaxEntries (least recently used goes); failures are cached too, so
// a region that cannot be mapped costs one attempt. It also maps the peer's memfd
// of region descriptors read-only (descriptor), so a put checks the target's
// table with loads instead of process_vm_readv. Everything is unmapped when
// the connection closes. A cached mapping keeps the peer's file alive after the
// peer freed it, until eviction or close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/connection.h"
#include "common/region_table.h"

namespace hmc_shm {

// How find_shared_file reads this process's mappings: PROCMAP_QUERY, an ioctl on
// /proc/self/maps that answers for one address (Linux 6.11; a few microseconds), or the
// text of that file (tens of microseconds, milliseconds with thousands of mappings, and
// paid on every registration of memory the application allocated itself). kAuto takes
// the ioctl where the kernel has it; tests pick one.
enum class MapsReader { kAuto, kQuery, kText };
bool has_procmap_query();
bool find_shared_file(const void* ptr, size_t len, hmc_net::RegionFile& out, MapsReader how = MapsReader::kAuto);

class PeerMappings final : public hmc_net::TransportState {
 public:
  static constexpr size_t kMaxEntries = 128;

  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  ~PeerMappings() override;

  // Where byte 0 of region `region` (registration `key`, `len` bytes in `file`
  // of process `pid`) is mapped here, or nullptr when it cannot be, with `why`
  // set on the first failure for that region (later calls return nullptr quietly).
  char* find_or_map(int pid, uint64_t region, uint64_t key, uint64_t len,
                    const hmc_net::RegionFile& file, std::string& why);
  // The peer's descriptor at `file` (its memfd of region descriptors; offset: the slot's),
  // mapped read-only here; nullptr when it cannot be (`why` set on the first failure for
  // that memfd; later calls return nullptr quietly).
  const hmc_net::RegionDesc* descriptor(int pid, const hmc_net::RegionFile& file, std::string& why);
  // Drops the mapping of a registration the target no longer has.
  void forget(uint64_t region, uint64_t key);
  // True the first time it is called: the connection logs one fallback only.
  bool first_fallback() { return !std::exchange(fell_back_, true); }

 private:
  struct Entry {
    uint64_t region = 0;
    uint64_t key = 0;
    uint64_t len = 0;
    hmc_net::RegionFile file;
    void* map = nullptr;  // nullptr: mapping failed, use CMA
    size_t map_len = 0;
    size_t delta = 0;  // region start within the mapping
    uint64_t used = 0;
  };
  static void unmap(Entry& e);

  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  bool fell_back_ = false;
  void* descs_ = nullptr;  // the peer's descriptors, read-only; nullptr: none or failed
  size_t descs_len_ = 0;
  hmc_net::RegionFile descs_file_;  // which memfd descs_ is (offset 0)
};

}  // namespace hmc_shm
