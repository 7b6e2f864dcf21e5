// hmc-conformance-net: the kit a vendor runs on a net provider plugin.
//
// It dlopens each plugin (HMC_CONFORMANCE_NET_PLUGIN or HMC_CONFORMANCE_PLUGIN =
// path[:path...], default every libhmc-net-*.so in the build's lib folder),
// lends it minimal host services of its own (log to stderr, config from a map,
// wake through a condition variable) and checks the contract of
// include/hmc/provider/net.h. Every wait has a deadline; child processes are
// always reaped. A plugin whose init says HMC_PROV_ERR_UNAVAILABLE is skipped.
//
// Environment: HMC_CONFORMANCE_SEED (random seed, printed),
// HMC_CONFORMANCE_TIMEOUT (seconds per wait, default 10),
// HMC_CONFORMANCE_VERBOSE=1 (the plugin's debug log), and any other HMC_*
// variable, handed to the plugin as its configuration (e.g. HMC_SHM_CMA=0).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "hmc/provider/net.h"

namespace hmc_conformance {

using Clock = std::chrono::steady_clock;
using Config = std::map<std::string, std::string>;

std::chrono::milliseconds timeout();
uint64_t seed();
std::vector<std::string> plugin_paths();
std::string file_provider_name(const std::string& path);
Config env_config();  // every HMC_* variable but the kit's own

// Host services lent to the plugin. A wake costs what libhmc's costs (core/progress.cpp):
// a count, and the condition variable only while someone sleeps on it. A sleeper counts
// itself in `sleepers` before it checks `wakes` under `mu`; a waker moves `wakes` before it
// reads `sleepers` (both sequentially consistent), so one of them sees the other.
struct TestHost {
  Config config;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<uint64_t> wakes{0};
  std::atomic<int> sleepers{0};
  // Sleeps until pred(wakes) holds or `limit` passes.
  template <class Pred>
  void sleep(std::chrono::milliseconds limit, Pred pred) {
    std::unique_lock lock(mu);
    sleepers.fetch_add(1);
    cv.wait_for(lock, limit, [&] { return pred(wakes.load()); });
    sleepers.fetch_sub(1);
  }
};

// What test() said about a request.
struct Outcome {
  int rc = HMC_PROV_ERR_INTERNAL;
  bool done = false;
  size_t bytes = 0;
  std::string message;
  bool timed_out = false;
};

// One loaded and initialised plugin state.
class Session {
 public:
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() { close(); }

  // Loads and initialises; returns false (with `reason`) when init failed.
  bool open(const std::string& path, Config config = env_config());
  void close();
  // A capability whose functions were appended counts only if the table holds them.
  bool has(uint64_t cap) const {
    if ((p->caps & cap) == 0) return false;
    if (cap == HMC_NET_CAP_MEM_ALLOC) return p->struct_size >= offsetof(hmc_net_provider_t, mem_free) + sizeof(p->mem_free);
    if (cap == HMC_NET_CAP_GET) return p->struct_size >= offsetof(hmc_net_provider_t, get) + sizeof(p->get);
    return true;
  }

  // Polls a request until done, failed or the deadline; the host's wake cuts waits short.
  // With `spins` > 0 it first polls that many times with a yield in between, as
  // libhmc's Request::wait does, before it sleeps until a wake; with kBusyPoll it polls
  // back to back, never yielding or sleeping (as ucx_perftest does).
  static constexpr int kBusyPoll = -1;
  Outcome wait(void* req, std::chrono::milliseconds limit = timeout(), int spins = 0);
  // Accepts one connection within the deadline and, with `keep`, keeps it as the host
  // does once the hello passed: waits for conn_status to report it ready (net.h).
  // nullptr on timeout, or when a kept connection failed.
  void* accept(void* listener, std::vector<char>* hello, bool keep = true);
  // Waits for conn_status to leave "connecting".
  int wait_connected(void* conn);
  // Sleeps until the plugin wakes the host or `limit` passes.
  void nap(std::chrono::milliseconds limit);
  // How many times the plugin called the host's wake so far.
  uint64_t wakes();
  // Waits until that count passes `seen` or `limit` passes; returns the count. A provider
  // calls wake after it completed a request (net.h), so `test` may see the end first.
  uint64_t wakes_past(uint64_t seen, std::chrono::milliseconds limit);

  // One progress call here and one in the partner: the other end of this process's pair
  // (connect_pair), which a provider without threads of its own (HMC_NET_CAP_POLLED)
  // moves only inside its calls, as a host's rank would.
  void progress();

  const hmc_net_provider_t* p = nullptr;
  Session* partner = nullptr;
  void* state = nullptr;
  int init_rc = HMC_PROV_ERR_INTERNAL;
  std::string reason;
  std::string path;

 private:
  void* dl_ = nullptr;
  TestHost host_;
  hmc_host_services_t services_{};
};

// A connection between two sessions (possibly the same one): a -> b.
struct Link {
  void* listener = nullptr;
  std::string addr;
  void* a = nullptr;  // connector side, in session a
  void* b = nullptr;  // acceptor side, in session b
};
// Listens on b, connects from a and accepts; Catch REQUIREs on failure.
Link connect_pair(Session& a, Session& b);
// Listens on 127.0.0.1 (Link::listener and Link::addr set); Catch REQUIREs on failure.
Link listen_local(Session& s);

// Messages with their checks (Catch REQUIREs on failure). A receive buffer has kSlack
// poisoned bytes past its capacity, which check_recv checks are untouched.
inline constexpr size_t kSlack = 64;
struct Recv {
  std::vector<char> buf;
  size_t cap = 0;
  void* req = nullptr;
};
void post_recv(Session& s, void* conn, Recv& r, size_t cap);
void* post_send(Session& s, void* conn, const std::vector<char>& data);
// The receive got exactly `want`, and nothing past it was written.
void check_recv(Session& s, Recv& r, const std::vector<char>& want);
void check_sent(Session& s, void* req, size_t len);

// Runs `body` once per plugin, each in its own section; unavailable plugins are skipped.
void for_each_plugin(const std::function<void(Session&)>& body);

// A process running this program in child mode; killed and reaped on destruction.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();
  pid_t pid() const { return pid_; }
  void kill();
  // Exit status (as from waitpid) or -1 when it did not exit in time.
  int wait_exit(std::chrono::milliseconds limit);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};
int child_main(int argc, char** argv);  // dispatch for --hmc-net-child
inline constexpr const char* kChildFlag = "--hmc-net-child";

// Host memory the way HMC_ALLOC_SHAREABLE makes it (device-providers/cpu): a
// memfd mapped MAP_SHARED whose fd stays open in this process, sealed against
// shrinking and growing, filled with `fill`. `sealed` false leaves the seals off,
// as an application's own memfd or a /dev/shm file has them. data() is nullptr
// when memfd_create, sealing or mmap failed (see error()).
class SharedMem {
 public:
  SharedMem(size_t len, unsigned char fill, bool sealed = true);
  SharedMem(const SharedMem&) = delete;
  SharedMem& operator=(const SharedMem&) = delete;
  ~SharedMem();
  char* data() const { return data_; }
  size_t size() const { return len_; }
  int fd() const { return fd_; }
  void close_fd();  // the mapping stays
  const std::string& error() const { return error_; }

 private:
  char* data_ = nullptr;
  size_t len_ = 0;
  int fd_ = -1;
  std::string error_;
};

// Deterministic test data.
std::vector<char> random_bytes(size_t n, uint64_t salt);
void fill_random(char* p, size_t n, uint64_t salt);
// Index of the first byte of [p, p+n) that differs from `value`, or n.
size_t first_not(const char* p, size_t n, unsigned char value);
// Index of the first byte where the two differ, or n.
size_t first_diff(const char* a, const char* b, size_t n);

inline constexpr unsigned char kPoison = 0xA5;

}  // namespace hmc_conformance
