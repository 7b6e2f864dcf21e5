#include "common/region_table.h"

#include "common/host.h"
#include "common/sealed_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

namespace hmc_net {

RegionTable::~RegionTable() {
  if (shared_ != nullptr) munmap(shared_, kSharedSlots * sizeof(RegionDesc));
  if (shared_file_.fd >= 0) close(static_cast<int>(shared_file_.fd));
}

bool RegionTable::share_descriptors(std::string& why) {
  std::lock_guard lock(mu_);
  if (shared_ != nullptr) return true;
  if (!slots_.empty()) {
    why = "descriptors can be shared only before the first registration";
    return false;
  }
  const size_t bytes = kSharedSlots * sizeof(RegionDesc);
  const int fd = create_sealed_memfd("hmc-regions", bytes, why);
  if (fd < 0) {
    why = "memfd for region descriptors: " + why;
    return false;
  }
  struct stat st {};
  void* base = fstat(fd, &st) == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    why = std::string("mapping the region descriptors: ") + std::strerror(errno);
    close(fd);
    return false;
  }
  shared_ = static_cast<RegionDesc*>(base);  // descriptors begin when their slot does (add)
  shared_file_ = RegionFile{fd, 0, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  return true;
}

void* RegionTable::add(void* ptr, uint64_t len, const RegionFile& file) {
  uint64_t key = random_key();
  std::lock_guard lock(mu_);
  Slot* s;
  if (!free_.empty()) {
    s = &slots_[free_.back()];
    free_.pop_back();
  } else {
    s = &slots_.emplace_back();
    s->id = slots_.size() - 1;
    // Constructed in place only now, so only the pages of slots in use are touched (the
    // file reads as zeroes, which is what RegionDesc{} writes).
    if (shared_ != nullptr && s->id < kSharedSlots) s->desc = new (&shared_[s->id]) RegionDesc{};
  }
  s->ptr = static_cast<char*>(ptr);
  s->len = len;
  s->key = key;
  s->file = file;
  const DescWords d{key,         reinterpret_cast<uint64_t>(ptr),
                    len,         static_cast<uint64_t>(file.fd),
                    file.offset, file.dev,
                    file.ino,    0};
  s->desc->addr.store(d.addr, std::memory_order_relaxed);
  s->desc->len.store(d.len, std::memory_order_relaxed);
  s->desc->file_fd.store(d.file_fd, std::memory_order_relaxed);
  s->desc->file_offset.store(d.file_offset, std::memory_order_relaxed);
  s->desc->file_dev.store(d.file_dev, std::memory_order_relaxed);
  s->desc->file_ino.store(d.file_ino, std::memory_order_relaxed);
  s->desc->check.store(desc_check(d), std::memory_order_relaxed);
  s->desc->key.store(key, std::memory_order_release);
  live_.insert(s);
  return s;
}

bool RegionTable::remove(void* handle, RegionInfo* gone) {
  std::lock_guard lock(mu_);
  auto* s = static_cast<Slot*>(handle);
  if (live_.erase(s) == 0) return false;
  if (gone != nullptr) *gone = RegionInfo{s->id, s->key, s->ptr, s->len, s->file, s->desc, {}};
  s->desc->key.store(0, std::memory_order_release);
  s->desc->check.store(0, std::memory_order_relaxed);
  s->key = 0;
  s->ptr = nullptr;
  s->len = 0;
  s->file = RegionFile{};
  free_.push_back(s->id);
  return true;
}

bool RegionTable::info(void* handle, RegionInfo& out) {
  std::lock_guard lock(mu_);
  auto* s = static_cast<Slot*>(handle);
  if (!live_.contains(s)) return false;
  RegionFile desc_file;  // fd -1: the descriptor is in private memory
  if (s->desc != &s->own) {
    desc_file = shared_file_;
    desc_file.offset = s->id * sizeof(RegionDesc);
  }
  out = RegionInfo{s->id, s->key, s->ptr, s->len, s->file, s->desc, desc_file};
  return true;
}

bool RegionTable::find_locked(uint64_t id, uint64_t key, uint64_t offset, uint64_t len, char*& dest,
                              std::string& why) {
  if (id >= slots_.size() || slots_[id].key == 0 || slots_[id].key != key) {
    why = "region " + std::to_string(id) + " is not registered (stale or forged remote key)";
    return false;
  }
  Slot& s = slots_[id];
  if (offset > s.len || len > s.len - offset) {
    why = "write of " + std::to_string(len) + " bytes at offset " + std::to_string(offset) +
          " leaves region " + std::to_string(id) + " (" + std::to_string(s.len) + " bytes)";
    return false;
  }
  dest = s.ptr + offset;
  return true;
}

}  // namespace hmc_net
