// Emulated device memory: faults on direct CPU access, copies between every kind of
// memory (interior pointers included), bounds, devices, foreign handles, and which
// pointers mem_query calls device memory.
#include <catch2/catch.hpp>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>

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

TEST_CASE("mem_query knows device memory of every instance and nothing else", "[emu][memory][query]") {
  Plugin emu(HMC_EMU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  REQUIRE((emu.p->caps & HMC_DEV_CAP_MEM_QUERY) != 0);
  struct Answer {
    int rc = -100;
    int device = -1;
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t id = 0;
  };
  auto query = [&](const void* p) {
    Answer a;
    void* base = nullptr;
    a.rc = emu.p->mem_query(emu.state, p, &a.device, &base, &a.bytes, &a.id);
    a.base = static_cast<char*>(base);
    INFO("mem_query(" << p << "): " << a.rc << " " << (a.rc < 0 ? emu.error() : ""));
    return a;
  };
  constexpr size_t kSize = 1 << 20;
  char* own = static_cast<char*>(emu.alloc(1, kSize));
  Answer a = query(own + 12345);
  CHECK(a.rc == 0);
  CHECK(a.device == 1);
  CHECK(a.base == own);
  CHECK(a.bytes == kSize);
  const uint64_t own_id = a.id;
  CHECK(own_id != 0);

  // An application's own runtime, modelled by a second instance: its memory is device
  // memory to the first, which copies it too. 3000 bytes: the rest of the page is not.
  auto app = std::make_unique<Plugin>(HMC_EMU_PLUGIN);
  REQUIRE(app->init_rc == HMC_PROV_OK);
  char* theirs = static_cast<char*>(app->alloc(0, 3000));
  a = query(theirs + 2999);
  CHECK(a.rc == 0);
  CHECK(a.device == 0);
  CHECK(a.base == theirs);
  CHECK(a.bytes == 3000);
  CHECK((a.id != 0 && a.id != own_id));
  CHECK(query(theirs + 3000).rc == 1);
  const auto data = random_bytes(3000, 7);
  app->write(theirs, data);
  CHECK(emu.read(theirs, 3000) == data);

  // Imported memory is device memory too, in the import window.
  uint8_t handle[HMC_IPC_HANDLE_MAX];
  size_t handle_len = 0;
  REQUIRE(emu.p->ipc_export(emu.state, own, kSize, handle, sizeof(handle), &handle_len) == 0);
  char* imported = nullptr;
  REQUIRE(emu.p->ipc_import(emu.state, handle, handle_len, reinterpret_cast<void**>(&imported)) == 0);
  a = query(imported + kSize - 1);
  CHECK(a.rc == 0);
  CHECK(a.device == 0);
  CHECK(a.base == imported);
  CHECK(a.bytes == kSize);
  CHECK(a.id == 0);  // the exporter's memfd id, which may meet one of this process's
  CHECK(emu.p->ipc_close(emu.state, imported) == 0);
  CHECK(query(imported).rc == 1);

  // Host memory of every kind, and device memory nobody holds, is not.
  void* pinned = emu.alloc(0, 4096, HMC_ALLOC_PINNED_HOST);
  std::vector<char> heap(4096);
  int on_stack = 0;
  CHECK(query(pinned).rc == 1);
  CHECK(query(heap.data()).rc == 1);
  CHECK(query(&on_stack).rc == 1);
  CHECK(query(nullptr).rc == 1);
  emu.free(0, pinned);
  emu.free(1, own);
  CHECK(query(own + 12345).rc == 1);
  char* again = static_cast<char*>(emu.alloc(1, kSize));  // first fit: where `own` was
  a = query(again);
  CHECK(a.rc == 0);
  INFO("the block after the free at " << static_cast<void*>(again) << ", before at " << static_cast<void*>(own));
  CHECK((a.id != 0 && a.id != own_id));
  emu.free(1, again);
  app->free(0, theirs);
  CHECK(query(theirs).rc == 1);

  // A device the asking instance has not is an error, and an instance that finished is
  // gone, memory it still held included (its fini warns about that block).
  Plugin wide(HMC_EMU_PLUGIN, {{"HMC_EMU_DEVICES", "3"}});
  REQUIRE(wide.init_rc == HMC_PROV_OK);
  char* third = static_cast<char*>(wide.alloc(2, 4096));
  CHECK(query(third).rc == HMC_PROV_ERR_INVALID);
  CHECK(emu.error().find("device 2") != std::string::npos);
  theirs = static_cast<char*>(app->alloc(1, 4096));
  CHECK(query(theirs).rc == 0);
  app.reset();
  CHECK(query(theirs).rc == 1);
  wide.free(2, third);
  int device = 0;
  size_t bytes = 0;
  uint64_t id = 0;
  CHECK(emu.p->mem_query(emu.state, heap.data(), &device, nullptr, &bytes, &id) == HMC_PROV_ERR_INVALID);
}
