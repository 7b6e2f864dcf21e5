// Registered memory: region id -> {ptr, len, random 64-bit key}.
//
// Slots live in a deque so their addresses never move: shm peers read a slot's
// descriptor straight out of this process with process_vm_readv. A slot is
// reused after deregistration with a fresh key, so a stale remote key is
// refused. The reader holds mutex() while it receives a put's payload into a
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

// Published for single-copy peers; `check` lets a reader detect a torn or
// garbage read. Deregistration clears `key` first.
struct RegionDesc {
  std::atomic<uint64_t> key{0};
  std::atomic<uint64_t> addr{0};
  std::atomic<uint64_t> len{0};
  std::atomic<uint64_t> check{0};
};

inline uint64_t desc_check(uint64_t key, uint64_t addr, uint64_t len) {
  return key ^ std::rotl(addr, 17) ^ std::rotl(len, 41) ^ 0x9e3779b97f4a7c15ull;
}

struct RegionInfo {
  uint64_t id = 0;
  uint64_t key = 0;
  char* ptr = nullptr;
  uint64_t len = 0;
  const RegionDesc* desc = nullptr;
};

class RegionTable {
 public:
  RegionTable() = default;
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;

  void* add(void* ptr, uint64_t len);
  bool remove(void* handle);
  bool info(void* handle, RegionInfo& out);

  std::mutex& mutex() { return mu_; }
  // With mutex() held: sets `dest` to where `len` bytes at `offset` of region
  // `id` go, or returns false with `why` when the key is wrong or the range
  // leaves the region.
  bool find_locked(uint64_t id, uint64_t key, uint64_t offset, uint64_t len, char*& dest,
                   std::string& why);

 private:
  struct Slot {
    RegionDesc desc;
    char* ptr = nullptr;
    uint64_t len = 0;
    uint64_t key = 0;
    uint64_t id = 0;
  };

  std::mutex mu_;
  std::deque<Slot> slots_;
  std::vector<uint64_t> free_;
  std::unordered_set<Slot*> live_;
};

}  // namespace hmc_net
