// Ordinary host blocks (HMC_ALLOC_DEVICE) of kMinBytes and more on transparent huge pages.
//
// Why: other ranks of this host reach a rank's plain host memory with process_vm_readv and
// process_vm_writev (the shm provider; 2-rank collectives over shared segments), and the
// kernel pins the remote pages one by one on every call. Reading 128 KiB took 10.4 us from
// 4 KiB pages and 5.5 us from one 2 MiB page (docs/performance.md).
//
// So a block of more than half a huge page is a mapping of its own, aligned to and rounded
// up to whole huge pages; a smaller one (kMinBytes and up) is a slot of a chunk: one huge
// page cut into slots of one power-of-two size, unmapped when its last slot is freed. Both
// are advised MADV_HUGEPAGE. The cost: a slot takes up to twice what was asked, a mapping
// of its own up to one huge page more, and every slot size in use holds a huge page that
// may be mostly free. A slot handed out again is zeroed, as fresh mappings are.
//
// Where the kernel has no transparent huge pages, has them set to "never" or refuses the
// advice, system_page() is 0 and the provider makes no arena. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace hmc::cpu {

class HugeArena {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;

  // The huge page size that madvise(MADV_HUGEPAGE) gets on this kernel, or 0.
  static size_t system_page();

  explicit HugeArena(size_t page) : page_(page) {}
  ~HugeArena();  // unmaps the chunks still there
  HugeArena(const HugeArena&) = delete;
  HugeArena& operator=(const HugeArena&) = delete;

  size_t page() const { return page_; }
  bool serves(size_t bytes) const { return page_ != 0 && bytes >= kMinBytes; }

  // A block of at least `bytes` (serves(bytes) must hold): its usable length in *length,
  // and whether it is a slot (freed with free_slot) or a mapping of its own (munmap).
  // Null with errno set when the kernel refused the memory.
  void* alloc(size_t bytes, size_t* length, bool* slot);
  void free_slot(void* p);

 private:
  struct Chunk {
    size_t slot_bytes = 0;
    uint64_t used = 0;  // bit i: slot i handed out
  };
  void* map_aligned(size_t length);  // `length` (whole huge pages), huge-page-aligned
  size_t slots_per_chunk(size_t slot_bytes) const { return page_ / slot_bytes; }

  const size_t page_;
  std::mutex mu_;
  std::map<uintptr_t, Chunk> chunks_;  // by base address
};

}  // namespace hmc::cpu
