#include "cpu_huge.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <sys/mman.h>

namespace hmc::cpu {
namespace {

constexpr size_t kMaxPage = size_t{32} << 20;  // larger PMD pages (arm64 with 64 KiB pages) are not used

// The first line of a sysfs file, or "" when it cannot be read.
std::string read_line(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return {};
  char buf[256] = {};
  const bool got = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  return got ? std::string(buf) : std::string();
}

}  // namespace

size_t HugeArena::system_page() {
  // "always [madvise] never": the bracketed word is the mode in force.
  const std::string mode = read_line("/sys/kernel/mm/transparent_hugepage/enabled");
  if (mode.empty() || mode.find("[never]") != std::string::npos) return 0;
  size_t page = size_t{2} << 20;
  const std::string size = read_line("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  if (!size.empty()) page = std::strtoull(size.c_str(), nullptr, 10);
  if (page < kMinBytes || page > kMaxPage || !std::has_single_bit(page)) return 0;
  // Some kernels (and sandboxes) list the modes but refuse the advice: then small pages it is.
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return 0;
  const bool advised = madvise(probe, page, MADV_HUGEPAGE) == 0;
  munmap(probe, page);
  return advised ? page : 0;
}

HugeArena::~HugeArena() {
  for (const auto& [base, chunk] : chunks_) munmap(reinterpret_cast<void*>(base), page_);
}

void* HugeArena::map_aligned(size_t length) {
  // Map one huge page more than needed, then cut off what lies outside the aligned range.
  void* raw = mmap(nullptr, length + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + page_ - 1) & ~(page_ - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + length + page_;
  if (end > aligned + length) munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, length, MADV_HUGEPAGE);  // accepted at start-up (system_page)
  return p;
}

void* HugeArena::alloc(size_t bytes, size_t* length, bool* slot) {
  if (bytes > page_ / 2) {
    if (bytes > SIZE_MAX - 2 * page_) {
      errno = ENOMEM;
      return nullptr;
    }
    *length = (bytes + page_ - 1) & ~(page_ - 1);
    *slot = false;
    return map_aligned(*length);
  }
  // Slots of at least page/64 bytes, so that a chunk's slots fit the 64 bits of `used`.
  const size_t slot_bytes = std::bit_ceil(std::max({bytes, kMinBytes, page_ / 64}));
  const uint64_t full = slots_per_chunk(slot_bytes) == 64 ? ~uint64_t{0} : (uint64_t{1} << slots_per_chunk(slot_bytes)) - 1;
  *length = slot_bytes;
  *slot = true;
  std::lock_guard lock(mu_);
  for (auto& [base, chunk] : chunks_) {
    if (chunk.slot_bytes != slot_bytes || chunk.used == full) continue;
    const int i = std::countr_one(chunk.used);
    chunk.used |= uint64_t{1} << i;
    auto* p = reinterpret_cast<uint8_t*>(base) + i * slot_bytes;
    std::memset(p, 0, slot_bytes);  // as a fresh mapping would be
    return p;
  }
  void* p = map_aligned(page_);
  if (p == nullptr) return nullptr;
  try {
    chunks_.emplace(reinterpret_cast<uintptr_t>(p), Chunk{slot_bytes, 1});
  } catch (...) {
    munmap(p, page_);
    errno = ENOMEM;
    return nullptr;
  }
  return p;
}

void HugeArena::free_slot(void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mu_);
  auto it = chunks_.upper_bound(addr);
  if (it == chunks_.begin()) return;
  --it;
  if (addr - it->first >= page_) return;  // not a slot of ours: mem_free checked it was
  it->second.used &= ~(uint64_t{1} << ((addr - it->first) / it->second.slot_bytes));
  if (it->second.used == 0) {
    munmap(reinterpret_cast<void*>(it->first), page_);
    chunks_.erase(it);
  }
}

}  // namespace hmc::cpu
