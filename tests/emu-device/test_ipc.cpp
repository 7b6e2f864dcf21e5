// IPC of emulated device memory between two real processes: the parent exports, a
// re-executed child imports, and each side sees the other's writes; also memory that
// another instance (the application's own runtime) allocated.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>

#include <sys/wait.h>

#include "emu_session.h"

using namespace hmc::emu_test;

namespace {

constexpr size_t kSize = (1 << 20) + 123;
constexpr size_t kInner = 8192;  // the second handle names base + kInner
constexpr size_t kChildBytes = 5000;

// The application's allocation: the range [kInner, kInner + kAppBytes) of it is exported.
constexpr size_t kAppBytes = kSize - kInner - 100;

std::vector<uint8_t> as_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// What a child says when it fails: to stderr and, as "failed: <what>", to the parent.
int child_failed(int out, const std::string& what, const Plugin& emu) {
  std::fprintf(stderr, "ipc child: %s: %s\n", what.c_str(), emu.p ? emu.error().c_str() : "");
  send_msg(out, as_bytes("failed: " + what));
  return 1;
}

// The child's last word must be "ok", and it must then exit 0 (reaped here).
void expect_ok_and_exit(Child& child) {
  std::vector<uint8_t> reply;
  REQUIRE(recv_msg(child.from, &reply));
  CHECK(std::string(reply.begin(), reply.end()) == "ok");
  const int status = reap(child.pid);
  child.pid = -1;
  close_child(child);
  INFO("child status " << status);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

}  // namespace

TEST_CASE("device memory is shared with another process both ways", "[emu][ipc]") {
  Plugin emu(HMC_EMU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  char* dev = static_cast<char*>(emu.alloc(1, kSize, HMC_ALLOC_DEVICE));
  emu.write(dev, random_bytes(kSize, 1));
  std::vector<uint8_t> whole(HMC_IPC_HANDLE_MAX), inner(HMC_IPC_HANDLE_MAX);
  size_t len = 0;
  REQUIRE(emu.p->ipc_export(emu.state, dev, kSize, whole.data(), whole.size(), &len) == 0);
  whole.resize(len);
  REQUIRE(emu.p->ipc_export(emu.state, dev + kInner, kSize - kInner, inner.data(), inner.size(), &len) == 0);
  inner.resize(len);

  Child child = spawn_child("ipc");
  REQUIRE(send_msg(child.to, whole));
  REQUIRE(send_msg(child.to, inner));
  std::vector<uint8_t> reply;
  REQUIRE(recv_msg(child.from, &reply));  // the child checked our data and wrote its own
  CHECK(std::string(reply.begin(), reply.end()) == "ok");
  auto want = random_bytes(kSize, 1);
  const auto from_child = random_bytes(kChildBytes, 2);
  std::copy(from_child.begin(), from_child.end(), want.begin() + kInner + 1);
  CHECK(emu.read(dev, kSize) == want);
  emu.write(dev, random_bytes(kSize, 3));  // now the child must see this
  REQUIRE(send_msg(child.to, as_bytes("go")));
  expect_ok_and_exit(child);
  emu.free(1, dev);
}

// As CUDA's ipc_export takes any cudaMalloc pointer, HMC's instance exports memory the
// application's own runtime (a second instance) allocated: the handle names that
// allocation, in this process and in another, and each export and import is logged.
TEST_CASE("device memory of another instance is exported, imported and shared", "[emu][ipc]") {
  const std::string log = "/tmp/hmc-emu-ipc-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  Plugin hmc(HMC_EMU_PLUGIN, {{"HMC_EMU_REGISTER_LOG", log}});
  Plugin app(HMC_EMU_PLUGIN);
  REQUIRE(hmc.init_rc == HMC_PROV_OK);
  REQUIRE(app.init_rc == HMC_PROV_OK);
  char* dev = static_cast<char*>(app.alloc(1, kSize));
  auto want = random_bytes(kSize, 4);
  app.write(dev, want);
  std::vector<uint8_t> handle(HMC_IPC_HANDLE_MAX);
  size_t len = 0;
  const int exported = hmc.p->ipc_export(hmc.state, dev + kInner, kAppBytes, handle.data(), handle.size(), &len);
  INFO("ipc_export: " << (exported ? hmc.error() : ""));
  REQUIRE(exported == HMC_PROV_OK);
  handle.resize(len);

  // In this process: a new pointer onto the same bytes.
  void* here = nullptr;
  REQUIRE(hmc.p->ipc_import(hmc.state, handle.data(), handle.size(), &here) == HMC_PROV_OK);
  CHECK(here != dev + kInner);
  CHECK(hmc.p->ipc_export(hmc.state, here, 16, handle.data(), handle.size(), &len) == HMC_PROV_ERR_INVALID);
  CHECK_THAT(hmc.error(), Catch::Contains("imported memory"));
  CHECK(hmc.read(here, kAppBytes) == std::vector<uint8_t>(want.begin() + kInner, want.begin() + kInner + kAppBytes));
  CHECK(hmc.p->ipc_close(hmc.state, here) == HMC_PROV_OK);

  Child child = spawn_child("ipc-app");
  REQUIRE(send_msg(child.to, handle));
  expect_ok_and_exit(child);  // the child checked the application's data and wrote its own
  const auto from_child = random_bytes(kAppBytes, 5);
  std::copy(from_child.begin(), from_child.end(), want.begin() + kInner);
  CHECK(app.read(dev, kSize) == want);

  app.free(1, dev);
  CHECK(hmc.p->ipc_export(hmc.state, dev + kInner, 16, handle.data(), handle.size(), &len) == HMC_PROV_ERR_INVALID);
  CHECK_THAT(hmc.error(), Catch::Contains("ipc_export") && Catch::Contains("outside any live allocation"));
  void* gone = nullptr;
  CHECK(hmc.p->ipc_import(hmc.state, handle.data(), handle.size(), &gone) == HMC_PROV_ERR_PEER_LOST);

  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::remove(log.c_str());
  const std::string bytes = std::to_string(kAppBytes);
  CHECK(lines == std::vector<std::string>{"ipc_export " + bytes, "ipc_import " + bytes});
}

// The child: imports both handles (and the first twice), checks, writes, closes.
namespace hmc::emu_test {

int ipc_child(int in, int out) {
  auto fail = [out](const std::string& what, const Plugin& emu) { return child_failed(out, what, emu); };
  Plugin emu(HMC_EMU_PLUGIN);
  if (emu.init_rc != HMC_PROV_OK) return fail("init " + emu.reason, emu);
  std::vector<uint8_t> whole, inner, go;
  if (!recv_msg(in, &whole) || !recv_msg(in, &inner)) return fail("no handles", emu);
  char *a = nullptr, *b = nullptr, *c = nullptr;
  auto* p = emu.p;
  void* s = emu.state;
  if (p->ipc_import(s, whole.data(), whole.size(), reinterpret_cast<void**>(&a)) != 0 ||
      p->ipc_import(s, inner.data(), inner.size(), reinterpret_cast<void**>(&b)) != 0 ||
      p->ipc_import(s, whole.data(), whole.size(), reinterpret_cast<void**>(&c)) != 0) {
    return fail("ipc_import", emu);
  }
  if (b != a + kInner || c != a) return fail("the imports are not one mapping", emu);
  // Read through a device allocation of our own: imported -> device -> host.
  void* local = nullptr;
  std::vector<uint8_t> got(kSize);
  if (p->mem_alloc(s, 0, kSize, HMC_ALLOC_DEVICE, &local) != 0 ||
      p->copy(s, local, a, kSize, nullptr) != 0 || p->copy(s, got.data(), local, kSize, nullptr) != 0) {
    return fail("copy", emu);
  }
  if (got != random_bytes(kSize, 1)) return fail("the exporter's data differs", emu);
  const auto mine = random_bytes(kChildBytes, 2);
  if (p->copy(s, b + 1, mine.data(), kChildBytes, nullptr) != 0) return fail("copy to import", emu);
  if (p->ipc_close(s, c) != 0) return fail("ipc_close of the second import", emu);
  send_msg(out, as_bytes("ok"));
  if (!recv_msg(in, &go)) return fail("no go", emu);
  if (p->copy(s, got.data(), a, kSize, nullptr) != 0) return fail("copy after close", emu);
  if (got != random_bytes(kSize, 3)) return fail("the exporter's second write is not seen", emu);
  if (p->ipc_close(s, b) != 0 || p->ipc_close(s, a) != 0) return fail("ipc_close", emu);
  if (p->ipc_close(s, a) != HMC_PROV_ERR_INVALID) return fail("a third close succeeded", emu);
  if (p->copy(s, got.data(), a, 16, nullptr) != HMC_PROV_ERR_INVALID) {
    return fail("a closed import still translates", emu);
  }
  p->mem_free(s, 0, local);
  send_msg(out, as_bytes("ok"));
  return 0;
}

// The child of the application's memory: imports its handle, checks, writes its own bytes.
int ipc_app_child(int in, int out) {
  Plugin emu(HMC_EMU_PLUGIN);
  if (emu.init_rc != HMC_PROV_OK) return child_failed(out, "init " + emu.reason, emu);
  std::vector<uint8_t> handle;
  if (!recv_msg(in, &handle)) return child_failed(out, "no handle", emu);
  auto* p = emu.p;
  void* s = emu.state;
  void* a = nullptr;
  if (p->ipc_import(s, handle.data(), handle.size(), &a) != 0) return child_failed(out, "ipc_import", emu);
  std::vector<uint8_t> got(kAppBytes, 0x5a);
  if (p->copy(s, got.data(), a, kAppBytes, nullptr) != 0) return child_failed(out, "copy from import", emu);
  const auto app = random_bytes(kSize, 4);
  if (got != std::vector<uint8_t>(app.begin() + kInner, app.begin() + kInner + kAppBytes)) {
    return child_failed(out, "the application's data differs", emu);
  }
  const auto mine = random_bytes(kAppBytes, 5);
  if (p->copy(s, a, mine.data(), kAppBytes, nullptr) != 0) return child_failed(out, "copy to import", emu);
  if (p->ipc_close(s, a) != 0) return child_failed(out, "ipc_close", emu);
  send_msg(out, as_bytes("ok"));
  return 0;
}

}  // namespace hmc::emu_test
