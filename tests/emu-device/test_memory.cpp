// Emulated device memory: faults on direct CPU access, copies between every kind of
// memory (interior pointers included), bounds, devices and foreign handles.
#include <catch2/catch.hpp>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu_session.h"

using namespace hmc::emu_test;

namespace {

// Runs `touch` in a forked child and returns its wait status.
template <class F>
int in_child(F touch) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not Catch's handler: die of the fault
    touch();
    _exit(0);
  }
  return reap(pid);
}

}  // namespace

TEST_CASE("the CPU cannot touch device memory, only pinned host memory", "[emu][memory]") {
  Plugin emu(HMC_EMU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  for (int kind : {HMC_ALLOC_DEVICE, HMC_ALLOC_SHAREABLE}) {
    char* dev = static_cast<char*>(emu.alloc(1, 1 << 20, kind));
    emu.write(dev, random_bytes(1 << 20, 1));
    int status = in_child([&] { (void)*reinterpret_cast<volatile char*>(dev); });
    INFO("status " << status);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
    status = in_child([&] { *reinterpret_cast<volatile char*>(dev + 12345) = 1; });
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
    // Syscalls handed a device pointer fail instead: what a socket send would see.
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    errno = 0;
    CHECK(write(fds[1], dev + 64, 16) == -1);
    CHECK(errno == EFAULT);
    iovec local{dev, 16};
    iovec remote{&fds, sizeof(fds)};
    CHECK(process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == -1);
    close(fds[0]);
    close(fds[1]);
    emu.free(1, dev);
  }
  auto* pinned = static_cast<uint8_t*>(emu.alloc(0, 4096, HMC_ALLOC_PINNED_HOST));
  std::memset(pinned, 0x3c, 4096);
  const auto back = emu.read(pinned, 4096);
  CHECK(std::all_of(back.begin(), back.end(), [](uint8_t c) { return c == 0x3c; }));
  emu.free(0, pinned);
}

TEST_CASE("copies work between host, pinned, both devices and imported memory",
          "[emu][memory][copy]") {
  Plugin emu(HMC_EMU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  constexpr size_t kSize = 64 << 10;
  constexpr size_t kSrcOff = 123;   // interior pointers, odd on purpose
  constexpr size_t kDstOff = 4099;
  constexpr size_t kBytes = 40000;
  std::vector<uint8_t> host(kSize);
  void* exported = emu.alloc(0, kSize, HMC_ALLOC_SHAREABLE);
  uint8_t handle[HMC_IPC_HANDLE_MAX];
  size_t handle_len = 0;
  REQUIRE(emu.p->ipc_export(emu.state, exported, kSize, handle, sizeof(handle), &handle_len) == 0);
  void* imported = nullptr;
  REQUIRE(emu.p->ipc_import(emu.state, handle, handle_len, &imported) == 0);
  CHECK(imported != exported);
  const std::pair<const char*, void*> kinds[] = {
      {"host", host.data()},
      {"pinned", emu.alloc(0, kSize, HMC_ALLOC_PINNED_HOST)},
      {"device 0", emu.alloc(0, kSize)},
      {"device 1", emu.alloc(1, kSize)},
      {"imported", imported},
  };
  uint64_t seed = 10;
  for (const auto& [src_name, src] : kinds) {
    for (const auto& [dst_name, dst] : kinds) {
      if (src == dst) continue;
      INFO(src_name << " -> " << dst_name);
      const auto data = random_bytes(kSize, ++seed);
      const std::vector<uint8_t> poison(kSize, 0xa5);
      emu.write(src, data);
      emu.write(dst, poison);
      REQUIRE(emu.p->copy(emu.state, static_cast<char*>(dst) + kDstOff,
                          static_cast<char*>(src) + kSrcOff, kBytes, nullptr) == 0);
      auto want = poison;
      std::copy(data.begin() + kSrcOff, data.begin() + kSrcOff + kBytes, want.begin() + kDstOff);
      CHECK(emu.read(dst, kSize) == want);
    }
  }
  // The import and the export are the same memory.
  const auto shared = random_bytes(kSize, 99);
  emu.write(exported, shared);
  CHECK(emu.read(imported, kSize) == shared);
  CHECK(emu.p->ipc_close(emu.state, imported) == 0);
  emu.free(0, kinds[1].second);
  emu.free(0, kinds[2].second);
  emu.free(1, kinds[3].second);
  emu.free(0, exported);
}

TEST_CASE("device pointers are checked: bounds, frees, devices", "[emu][memory]") {
  Plugin emu(HMC_EMU_PLUGIN, {{"HMC_EMU_DEVICES", "3"}, {"HMC_EMU_MEMORY", "64M"}});
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  int count = 0;
  REQUIRE(emu.p->device_count(emu.state, &count) == 0);
  CHECK(count == 3);
  hmc_device_info_t info{};
  info.struct_size = sizeof(info);
  REQUIRE(emu.p->device_info(emu.state, 2, &info) == 0);
  CHECK(std::string(info.vendor) == "emu");
  CHECK(std::string(info.model) == "HMC emulated device");
  CHECK(info.mem_kind == HMC_MEM_DEVICE);
  CHECK(info.memory_bytes == (64u << 20));
  CHECK(info.pci_bus_id[0] == '\0');
  CHECK(info.numa_node == -1);

  char* a = static_cast<char*>(emu.alloc(0, 1000));
  char* b = static_cast<char*>(emu.alloc(2, 1000));
  std::vector<uint8_t> host(2000);
  CHECK(emu.p->copy(emu.state, host.data(), a + 900, 101, nullptr) == HMC_PROV_ERR_INVALID);
  CHECK_FALSE(emu.error().empty());
  CHECK(emu.p->copy(emu.state, a + 1, b, 999, nullptr) == 0);  // ends exactly at the end
  // Which device a pointer belongs to is known: the wrong device cannot free it.
  CHECK(emu.p->mem_free(emu.state, 1, b) == HMC_PROV_ERR_INVALID);
  CHECK(emu.error().find("device 2") != std::string::npos);
  CHECK(emu.p->mem_free(emu.state, 0, a + 256) == HMC_PROV_ERR_INVALID);
  emu.free(0, a);
  CHECK(emu.p->copy(emu.state, host.data(), a, 10, nullptr) == HMC_PROV_ERR_INVALID);
  CHECK(emu.p->mem_free(emu.state, 0, a) == HMC_PROV_ERR_INVALID);
  void* big = nullptr;
  CHECK(emu.p->mem_alloc(emu.state, 1, 65u << 20, HMC_ALLOC_DEVICE, &big) == HMC_PROV_ERR_NO_MEMORY);
  CHECK(emu.p->mem_alloc(emu.state, 3, 10, HMC_ALLOC_DEVICE, &big) == HMC_PROV_ERR_INVALID);
  emu.free(2, b);
}

TEST_CASE("malformed parameters fail init with the reason", "[emu][init]") {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"HMC_EMU_DEVICES", "two"}, {"HMC_EMU_DEVICES", "0"}, {"HMC_EMU_MEMORY", "4Q"},
           {"HMC_EMU_MEMORY", "-1G"}, {"HMC_EMU_STREAM_DELAY_US", "1.5"}}) {
    Plugin bad(HMC_EMU_PLUGIN, {{name, value}});
    INFO(name << "=" << value);
    CHECK(bad.init_rc == HMC_PROV_ERR_INVALID);
    CHECK(bad.reason.find(name) != std::string::npos);
  }
  Plugin ok(HMC_EMU_PLUGIN, {{"HMC_EMU_MEMORY", "512MiB"}});
  CHECK(ok.init_rc == HMC_PROV_OK);
}
