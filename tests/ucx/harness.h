// What the ucx provider's own tests share: the plugin loaded through the ABI, a peer
// process, the CPU time of a thread, UCX_TLS set for one case.
#pragma once

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "hmc/hmc.h"
#include "hmc/provider/net.h"

namespace ucx_test {

// Whether a plugin that does not start fails the case (HMC_UCX_TESTS_REQUIRE=1, which
// ctest sets: the plugin was built, so init breaking is a regression), or skips it.
inline bool ucx_required() {
  const char* v = std::getenv("HMC_UCX_TESTS_REQUIRE");
  return v != nullptr && std::string(v) == "1";
}

// The plugin did not start (`why`): fails the case where it is required, else warns that
// the case is skipped. Returns true.
inline bool unavailable(const std::string& why) {
  if (ucx_required()) FAIL("ucx provider unavailable (" << why << "), and HMC_UCX_TESTS_REQUIRE=1");
  WARN("ucx provider unavailable here (" << why << "): skipped");
  return true;
}

// True, with a warning that the case is skipped, where the ucx provider did not load.
inline bool ucx_missing() {
  auto ctx = hmc::Context::create();
  std::string why = ctx ? "not found" : ctx.status().to_string();
  if (ctx)
    for (const auto& p : ctx->providers())
      if (p.name == "ucx") {
        if (p.available) return false;
        why = p.reason;
      }
  return unavailable(why);
}

using Clock = std::chrono::steady_clock;

// Settings for ranks with ucx the only net provider, over these UCX transports.
inline std::map<std::string, std::string> over_ucx(const std::string& tls) {
  return {{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_UCX_TLS", tls}, {"HMC_TIMEOUT", "30s"}};
}

// A number every rank of a test sees (shared anonymous memory, made before the ranks
// fork): how a rank that stays out of HMC learns when to come back.
class SharedFlag {
 public:
  SharedFlag()
      : v_(static_cast<std::atomic<int>*>(
            mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    REQUIRE(v_ != MAP_FAILED);
    v_->store(0);
  }
  ~SharedFlag() { munmap(v_, sizeof(std::atomic<int>)); }
  SharedFlag(const SharedFlag&) = delete;
  SharedFlag& operator=(const SharedFlag&) = delete;
  void store(int v) const { v_->store(v); }
  int load() const { return v_->load(); }
  // Waits up to 10 s for the flag to reach `round`; whether it did.
  bool await(int round) const {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (load() < round && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return load() >= round;
  }

 private:
  std::atomic<int>* v_;
};

inline int no_config(void*, const char*, char*, size_t) { return 1; }
inline void quiet(void*, int, const char*, const char*) {}
inline void no_wake(void*) {}

// The plugin, loaded and initialised with every transport UCX finds; closed on scope exit.
struct Plugin {
  // `config`: the parameters the host hands the plugin (none by default: every default).
  explicit Plugin(std::map<std::string, std::string> config = {}) : settings(std::move(config)) {
    if (!settings.empty()) {
      host.host = &settings;
      host.config_get = [](void* h, const char* name, char* value, size_t len) {
        const auto& m = *static_cast<const std::map<std::string, std::string>*>(h);
        const auto it = m.find(name);
        if (it == m.end()) return 1;
        if (it->second.size() + 1 > len) return -1;
        std::memcpy(value, it->second.c_str(), it->second.size() + 1);
        return 0;
      };
    }
    dl = dlopen(HMC_UCX_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (dl == nullptr) return;
    auto entry = reinterpret_cast<hmc_net_entry_v1_fn>(dlsym(dl, HMC_NET_ENTRY_V1));
    if (entry == nullptr) return;
    p = entry();
    char why[256] = {};
    if (p->init(&host, &state, why, sizeof why) != HMC_PROV_OK) {
      reason = why;
      state = nullptr;
    }
  }
  ~Plugin() {
    if (state != nullptr) p->fini(state);
    if (dl != nullptr) dlclose(dl);
  }
  // Polls conn_status until it leaves "in progress" or 10 s pass.
  int wait_up(void* conn) const {
    const auto until = Clock::now() + std::chrono::seconds(10);
    int rc = p->conn_status(state, conn);
    while (rc == HMC_PROV_IN_PROGRESS && Clock::now() < until) {
      p->progress(state);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rc = p->conn_status(state, conn);
    }
    return rc;
  }
  // Polls `req` until it ends or 10 s pass; its return code, or 1 when still pending.
  // The bytes it moved in `moved`, when given.
  int wait(void* req, size_t* moved = nullptr) const {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until) {
      int done = 0;
      size_t bytes = 0;
      char why[256];
      int rc = p->test(state, req, &done, &bytes, why, sizeof why);
      if (moved != nullptr) *moved = bytes;
      if (rc < 0 || done) return rc;
      p->progress(state);
    }
    return 1;
  }
  // True, with a warning that the case is skipped, where the plugin did not start.
  bool missing() const {
    return state == nullptr && unavailable(reason);
  }
  // Listens on 127.0.0.1; the published address, empty on failure.
  std::string listen(void*& listener) const {
    char addr[HMC_NET_ADDR_MAX];
    size_t len = 0;
    if (p->listen(state, "127.0.0.1", addr, sizeof addr, &len, &listener) != HMC_PROV_OK) return {};
    return {addr, len};
  }
  // A connection to `addr`, up (conn_status 0) within 10 s; null otherwise.
  void* connect_up(const std::string& addr, const std::string& hello) const {
    void* conn = nullptr;
    if (p->connect(state, addr.data(), addr.size(), hello.data(), hello.size(), &conn) != 0) return nullptr;
    return wait_up(conn) == HMC_PROV_OK ? conn : nullptr;
  }
  // A connection of this provider to itself, accepted but not yet vouched for (conn_status);
  // `in` is null when any step failed.
  struct Loop {
    void* listener = nullptr;
    void* out = nullptr;
    void* in = nullptr;
  };
  Loop loop(const std::string& hello) const {
    Loop l;
    const std::string where = listen(l.listener);
    if (where.empty() || p->connect(state, where.data(), where.size(), hello.data(), hello.size(), &l.out) != 0) return l;
    std::string got;
    l.in = accept(l.listener, got);
    if (got != hello) l.in = nullptr;
    return l;
  }
  // accept() until a connection comes or 10 s pass; its hello in `hello`.
  void* accept(void* listener, std::string& hello) const {
    const auto until = Clock::now() + std::chrono::seconds(10);
    char buf[HMC_NET_HELLO_MAX];
    while (Clock::now() < until) {
      void* conn = nullptr;
      size_t len = 0;
      if (p->accept(state, listener, &conn, buf, sizeof buf, &len) == HMC_PROV_OK) {
        hello.assign(buf, len);
        return conn;
      }
      p->progress(state);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return nullptr;
  }
  std::map<std::string, std::string> settings;
  hmc_host_services_t host{sizeof(hmc_host_services_t), nullptr, quiet, no_config, no_wake};
  void* dl = nullptr;
  const hmc_net_provider_t* p = nullptr;
  void* state = nullptr;
  std::string reason;
};

// CPU seconds this process's thread called `name` has used so far (0 when none is found).
inline double thread_cpu_seconds(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {  // fields 14 and 15: utime, stime
      if (i == 14) utime = std::stoull(f);
      if (i == 15) stime = std::stoull(f);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return 0;
}

// A child process holding one accepted, ready ucx connection and then doing nothing, or
// with `echo` sending every message (up to 256 bytes) back; stopped and killed by the
// test, and always reaped. Fork it before this process loads the plugin.
struct Peer {
  explicit Peer(bool echo = false) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      Plugin u;
      void* listener = nullptr;
      const std::string addr = u.state != nullptr ? u.listen(listener) : std::string();
      if (addr.empty()) _exit(2);
      if (write(fds[1], addr.data(), addr.size()) != static_cast<ssize_t>(addr.size())) _exit(3);
      close(fds[1]);
      std::string hello;
      void* conn = u.accept(listener, hello);
      if (conn == nullptr || u.wait_up(conn) != HMC_PROV_OK) _exit(4);
      if (!echo) for (;;) pause();
      for (char buf[256];;) {  // each message back as it came, polled as a busy rank polls
        void* r = nullptr;
        if (u.p->recv_msg(u.state, conn, buf, sizeof buf, &r) != HMC_PROV_OK) _exit(5);
        int rc = 1;
        size_t bytes = 0;
        while (rc == 1) rc = u.wait(r, &bytes);
        if (rc != HMC_PROV_OK) _exit(6);
        void* s = nullptr;
        if (u.p->send_msg(u.state, conn, buf, bytes, &s) != HMC_PROV_OK || u.wait(s) != HMC_PROV_OK) _exit(7);
      }
    }
    close(fds[1]);
    char buf[HMC_NET_ADDR_MAX];
    pollfd pf{fds[0], POLLIN, 0};
    ssize_t n = poll(&pf, 1, 10000) > 0 ? read(fds[0], buf, sizeof buf) : -1;
    if (n > 0) addr.assign(buf, static_cast<size_t>(n));
    close(fds[0]);
  }
  ~Peer() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  bool ready() const { return pid > 0 && !addr.empty(); }
  pid_t pid = -1;
  std::string addr;
};

// UCX_TLS set to `value` until the end of the scope (then as it was).
struct ScopedTls {
  explicit ScopedTls(const char* value) {
    const char* before = std::getenv("UCX_TLS");
    had = before != nullptr;
    if (had) saved = before;
    setenv("UCX_TLS", value, 1);
  }
  ~ScopedTls() { had ? setenv("UCX_TLS", saved.c_str(), 1) : unsetenv("UCX_TLS"); }
  ScopedTls(const ScopedTls&) = delete;
  ScopedTls& operator=(const ScopedTls&) = delete;
  bool had = false;
  std::string saved;
};

}  // namespace ucx_test
