// The cpu provider's plain host blocks: from 64 KiB up on transparent huge pages
// (device-providers/cpu/cpu_huge.h), smaller ones and HMC_CPU_HUGE_PAGES=0 as before.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "hmc/context.h"

using namespace hmc;

namespace {

// Whether madvise(MADV_HUGEPAGE) means anything on this kernel, and it takes the advice.
bool kernel_has_thp() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  if (!std::getline(f, mode) || mode.find("[never]") != std::string::npos) return false;
  void* probe = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return false;
  const bool advised = madvise(probe, 2 << 20, MADV_HUGEPAGE) == 0;
  munmap(probe, 2 << 20);
  return advised;
}

// The VmFlags of the mapping that holds `p` ("" when none does): "hg" is MADV_HUGEPAGE.
std::string vm_flags(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(f, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

bool huge_advised(const void* p) { return vm_flags(p).find(" hg ") != std::string::npos; }

bool mapped(const void* p) {
  unsigned char v = 0;
  void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095});
  return mincore(page, 1, &v) == 0 || errno != ENOMEM;
}

bool all_equal(const Memory& m, uint8_t value) {
  const auto* b = static_cast<const uint8_t*>(m.data());
  for (std::size_t i = 0; i < m.size(); ++i)
    if (b[i] != value) return false;
  return true;
}

}  // namespace

TEST_CASE("plain host blocks of 64 KiB and more are advised onto huge pages", "[memory]") {
  const bool thp = kernel_has_thp();  // else: no block may be advised
  auto ctx = Context::create();
  REQUIRE(ctx.ok());
  const std::size_t sizes[] = {4096, 60 << 10, 64 << 10, 100 << 10, 1 << 20, (1 << 20) + 1, 3 << 20};
  std::vector<Memory> blocks;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    auto m = ctx->alloc({"cpu", 0}, sizes[i]);
    REQUIRE(m.ok());
    CHECK(m->size() == sizes[i]);
    CHECK(all_equal(m.value(), 0));  // fresh memory reads as zeros, slot or mapping
    CHECK(reinterpret_cast<uintptr_t>(m->data()) % 4096 == 0);
    CHECK(huge_advised(m->data()) == (thp && sizes[i] >= (64 << 10)));
    std::memset(m->data(), static_cast<int>(i + 1), m->size());
    blocks.push_back(std::move(m.value()));
  }
  // No block overlaps another: each still holds its own pattern.
  for (std::size_t i = 0; i < blocks.size(); ++i) CHECK(all_equal(blocks[i], static_cast<uint8_t>(i + 1)));
  if (thp) CHECK(reinterpret_cast<uintptr_t>(blocks.back().data()) % (2 << 20) == 0);  // a mapping of its own
  CHECK(ctx->device_of(static_cast<uint8_t*>(blocks[3].data()) + 1000) == DeviceId{"cpu", 0});
}

TEST_CASE("a freed slot comes back zeroed and an empty chunk goes back to the kernel", "[memory]") {
  if (!kernel_has_thp()) {
    SUCCEED("transparent huge pages are off in this kernel: no chunks");
    return;
  }
  auto ctx = Context::create();
  REQUIRE(ctx.ok());
  auto a = ctx->alloc({"cpu", 0}, 128 << 10);
  auto b = ctx->alloc({"cpu", 0}, 128 << 10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // Two slots of one chunk: next to each other inside one huge page.
  const auto pa = reinterpret_cast<uintptr_t>(a->data()), pb = reinterpret_cast<uintptr_t>(b->data());
  CHECK(pa / (2 << 20) == pb / (2 << 20));
  std::memset(a->data(), 0xAB, a->size());
  std::memset(b->data(), 0xCD, b->size());
  void* where = a->data();
  a.value() = Memory();  // frees the slot
  auto c = ctx->alloc({"cpu", 0}, 100 << 10);
  REQUIRE(c.ok());
  CHECK(c->data() == where);  // the lowest free slot of the size
  CHECK(all_equal(c.value(), 0));
  CHECK(all_equal(b.value(), 0xCD));
  const void* chunk = b->data();
  b.value() = Memory();
  CHECK(mapped(chunk));  // c still holds a slot of it
  c.value() = Memory();
  CHECK_FALSE(mapped(chunk));
}

TEST_CASE("HMC_CPU_HUGE_PAGES=0 keeps every plain block on small pages", "[memory][config]") {
  auto ctx = Context::create({{{"HMC_CPU_HUGE_PAGES", "0"}}});
  REQUIRE(ctx.ok());
  auto m = ctx->alloc({"cpu", 0}, 1 << 20);
  REQUIRE(m.ok());
  CHECK_FALSE(huge_advised(m->data()));
  CHECK(all_equal(m.value(), 0));
}

// Shareable memory is a memfd that peers map (ipc_import, shm's puts). Its size is sealed:
// had its owner shrunk it, a peer's next write through the mapping would die of SIGBUS.
TEST_CASE("shareable memory lies in a memfd sealed against shrinking and growing", "[memory][ipc]") {
  auto ctx = Context::create();
  REQUIRE(ctx.ok());
  auto mem = ctx->alloc({"cpu", 0}, 1 << 20, AllocKind::kShareable);
  REQUIRE(mem.ok());
  std::memset(mem->data(), 7, mem->size());
  int found = 0;
  DIR* dir = opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  while (dirent* e = readdir(dir)) {
    char link[256] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n <= 0 || std::strncmp(link, "/memfd:hmc-cpu-", 15) != 0) continue;
    const int fd = std::atoi(e->d_name);
    INFO(link);
    ++found;
    CHECK((fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
    const int rc = ftruncate(fd, 0);
    const int err = errno;
    CHECK(rc != 0);
    CHECK(err == EPERM);
  }
  closedir(dir);
  CHECK(found >= 1);
  CHECK(all_equal(*mem, 7));  // the attempts changed nothing
}

// The kernel's overcommit check lets a memfd of any size map; without a check of its own
// the provider handed out a block that the OOM killer ended when it was touched.
TEST_CASE("a block larger than the machine's memory and swap is refused, of every kind", "[memory]") {
  struct sysinfo info {};
  REQUIRE(sysinfo(&info) == 0);
  const std::size_t most = (std::size_t{info.totalram} + info.totalswap) * info.mem_unit;
  auto ctx = Context::create();
  REQUIRE(ctx.ok());
  for (auto kind : {AllocKind::kShareable, AllocKind::kDefault, AllocKind::kPinnedHost}) {
    auto mem = ctx->alloc({"cpu", 0}, most + (std::size_t{1} << 30), kind);
    INFO(static_cast<int>(kind));
    REQUIRE(mem.status().code() == ErrorCode::kNoMemory);
    CHECK(mem.status().message().find("memory and swap") != std::string::npos);
  }
  auto fits = ctx->alloc({"cpu", 0}, 1 << 20, AllocKind::kShareable);
  REQUIRE(fits.ok());
}
