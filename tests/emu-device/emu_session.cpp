// Test helpers for the emulated device (see emu_session.h).
#include "emu_session.h"

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace hmc::emu_test {
namespace {

void host_log(void* host, int level, const char* provider, const char* message) {
  if (level >= HMC_LOG_WARN) std::fprintf(stderr, "[%s] %s\n", provider, message);
}

int host_config_get(void* host, const char* name, char* value, size_t value_len) {
  const auto* config = static_cast<const Config*>(host);
  const auto it = config->find(name);
  if (it == config->end()) return 1;
  if (it->second.size() + 1 > value_len) return -1;
  std::memcpy(value, it->second.c_str(), it->second.size() + 1);
  return 0;
}

void host_wake(void*) {}

}  // namespace

Plugin::Plugin(const char* path, Config config) : config_(std::move(config)) {
  host_ = {sizeof(hmc_host_services_t), &config_, host_log, host_config_get, host_wake};
  dl_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl_ == nullptr) {
    reason = dlerror();
    return;
  }
  auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl_, HMC_DEVICE_ENTRY_V1));
  p = entry != nullptr ? entry() : nullptr;
  if (p == nullptr) {
    reason = "no entry symbol";
    return;
  }
  char why[512] = {};
  init_rc = p->init(&host_, &state, why, sizeof(why));
  reason = why;
}

Plugin::~Plugin() {
  if (init_rc == HMC_PROV_OK) p->fini(state);
  if (dl_ != nullptr) dlclose(dl_);
}

void* Plugin::alloc(int device, size_t bytes, int kind) {
  void* ptr = nullptr;
  const int rc = p->mem_alloc(state, device, bytes, kind, &ptr);
  INFO("mem_alloc(device " << device << ", " << bytes << ", kind " << kind << "): " << rc << " "
                           << (rc ? error() : ""));
  REQUIRE(rc == HMC_PROV_OK);
  return ptr;
}

void Plugin::free(int device, void* ptr) { CHECK(p->mem_free(state, device, ptr) == HMC_PROV_OK); }

void Plugin::write(void* dst, const std::vector<uint8_t>& src) {
  const int rc = p->copy(state, dst, src.data(), src.size(), nullptr);
  INFO("copy to " << dst << ": " << (rc ? error() : ""));
  REQUIRE(rc == HMC_PROV_OK);
}

std::vector<uint8_t> Plugin::read(const void* src, size_t n) {
  std::vector<uint8_t> out(n, 0x5a);
  const int rc = p->copy(state, out.data(), src, n, nullptr);
  INFO("copy from " << src << ": " << (rc ? error() : ""));
  REQUIRE(rc == HMC_PROV_OK);
  return out;
}

int Plugin::wait(int (*query)(void*, void*), void* object) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  int rc = query(state, object);
  while (rc == HMC_PROV_IN_PROGRESS && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    rc = query(state, object);
  }
  return rc;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& c : out) c = static_cast<uint8_t>(rng());
  return out;
}

Child spawn_child(const std::string& role) {
  int down[2];  // parent -> child
  int up[2];    // child -> parent
  REQUIRE(pipe2(down, O_CLOEXEC) == 0);
  REQUIRE(pipe2(up, O_CLOEXEC) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // dup2 clears FD_CLOEXEC on the copies the exec'ed child keeps
    dup2(down[0], 3);
    dup2(up[1], 4);
    execl("/proc/self/exe", "hmc-emu-device-tests", "--emu-child", role.c_str(), "3", "4",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  return Child{pid, down[1], up[0]};
}

namespace {
bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t put = write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}
}  // namespace

bool send_msg(int fd, const std::vector<uint8_t>& msg) {
  const uint32_t len = static_cast<uint32_t>(msg.size());
  return write_all(fd, &len, 4) && write_all(fd, msg.data(), msg.size());
}

namespace {
bool read_exact(int fd, uint8_t* out, size_t n, std::chrono::steady_clock::time_point deadline) {
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t got = read(fd, out, n);
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}
}  // namespace

bool recv_msg(int fd, std::vector<uint8_t>* msg, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  uint32_t len = 0;
  if (!read_exact(fd, reinterpret_cast<uint8_t*>(&len), 4, until)) return false;
  msg->assign(len, 0);
  return read_exact(fd, msg->data(), len, until);
}

int reap(pid_t pid, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void close_child(Child& c) {
  if (c.to >= 0) close(c.to);
  if (c.from >= 0) close(c.from);
  c.to = c.from = -1;
  if (c.pid > 0) reap(c.pid, std::chrono::seconds(5));
  c.pid = -1;
}

}  // namespace hmc::emu_test
