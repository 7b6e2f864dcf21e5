// Registered memory: region id -> {ptr, len, random 64-bit key}, and for a
// region inside a MAP_SHARED file mapping (shm), the file that backs it.
//
// Slots live in a deque so their addresses never move: shm peers read a slot's
// descriptor straight out of this process with process_vm_readv, or, after
// share_descriptors(), through a read-only mapping of the memfd that holds the
// first kSharedSlots descriptors (a load instead of a system call per put). A
// slot is reused after deregistration with a fresh key, so a stale remote key
// is refused. The reader holds mutex() while it receives a put's payload into a
// region, so dereg_mem never returns while bytes are still landing there.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace hmc_net {

// The shared file behind a region: an fd of the owner open on it (peers open
// /proc/<pid>/fd/<fd>), the file offset of the region's first byte, and the
// file's identity, which a peer checks after opening. fd < 0: none.
struct RegionFile {
  int64_t fd = -1;
  uint64_t offset = 0;
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const RegionFile&) const = default;
};

// Published for single-copy peers; `check` lets a reader detect a torn or
// garbage read. Deregistration clears `key` first.
struct RegionDesc {
  std::atomic<uint64_t> key{0};
  std::atomic<uint64_t> addr{0};
  std::atomic<uint64_t> len{0};
  std::atomic<uint64_t> file_fd{0};  // RegionFile, fd as two's complement
  std::atomic<uint64_t> file_offset{0};
  std::atomic<uint64_t> file_dev{0};
  std::atomic<uint64_t> file_ino{0};
  std::atomic<uint64_t> check{0};
};

// The descriptor as plain words, in RegionDesc's order (what a peer reads).
struct DescWords {
  uint64_t key, addr, len, file_fd, file_offset, file_dev, file_ino, check;
  RegionFile file() const {
    return RegionFile{static_cast<int64_t>(file_fd), file_offset, file_dev, file_ino};
  }
};
static_assert(sizeof(DescWords) == sizeof(RegionDesc));

inline uint64_t desc_check(const DescWords& d) {
  uint64_t h = d.key ^ 0x9e3779b97f4a7c15ull;
  int rot = 17;
  for (uint64_t w : {d.addr, d.len, d.file_fd, d.file_offset, d.file_dev, d.file_ino}) {
    h ^= std::rotl(w, rot);
    rot = (rot + 11) % 64;
  }
  return h;
}

struct RegionInfo {
  uint64_t id = 0;
  uint64_t key = 0;
  char* ptr = nullptr;
  uint64_t len = 0;
  RegionFile file;
  const RegionDesc* desc = nullptr;
  RegionFile desc_file;  // the memfd holding `desc` (offset: where in it); fd -1: private memory
};

class RegionTable {
 public:
  static constexpr uint64_t kSharedSlots = 16384;  // 1 MiB of descriptors, touched as used

  RegionTable() = default;
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;
  ~RegionTable();

  // Before the first add: descriptors of the first kSharedSlots slots go into a memfd that
  // peers of the same user may map. False, with `why`, when it cannot be made (descriptors
  // stay in private memory).
  bool share_descriptors(std::string& why);

  void* add(void* ptr, uint64_t len, const RegionFile& file = {});
  // `gone`: what the region was (its id and memory, for PutFence).
  bool remove(void* handle, RegionInfo* gone = nullptr);
  bool info(void* handle, RegionInfo& out);

  std::mutex& mutex() { return mu_; }
  // With mutex() held: sets `dest` to where `len` bytes at `offset` of region
  // `id` go, or returns false with `why` when the key is wrong or the range
  // leaves the region.
  bool find_locked(uint64_t id, uint64_t key, uint64_t offset, uint64_t len, char*& dest,
                   std::string& why);

 private:
  struct Slot {
    RegionDesc own;
    RegionDesc* desc = &own;  // own, or its place in the shared memfd
    char* ptr = nullptr;
    uint64_t len = 0;
    uint64_t key = 0;
    uint64_t id = 0;
    RegionFile file;
  };

  std::mutex mu_;
  std::deque<Slot> slots_;
  std::vector<uint64_t> free_;
  std::unordered_set<Slot*> live_;
  RegionDesc* shared_ = nullptr;  // kSharedSlots descriptors in the memfd `shared_file_`
  RegionFile shared_file_;
};

}  // namespace hmc_net
