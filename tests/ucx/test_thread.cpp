// The ucx provider's thread when UCX's worker cannot be armed. After a peer died over
// shared memory the worker was seen answering UCS_ERR_BUSY to every ucp_worker_arm: the
// thread cannot sleep on the worker's fd then and must look again by itself, without
// taking a core for it (one CI run caught it at 38 % of one while a close waited), and
// must still deliver what arrives while the host is not polling. The stuck state cannot
// be made on demand, so this executable stands in for ucp_worker_arm.
#include <dlfcn.h>
#include <sys/epoll.h>

#include <cerrno>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <ucp/api/ucp.h>

#include "harness.h"

using ucx_test::Clock;
using ucx_test::Peer;
using ucx_test::Plugin;

namespace {

std::atomic<bool> g_arm_busy{false};
std::atomic<long> g_arm_calls{0};
std::atomic<bool> g_pwait2_refused{false};
std::atomic<long> g_pwait2_calls{0};

}  // namespace

// epoll_pwait2 as the plugin sees it: ENOSYS while g_pwait2_refused is set, as on a kernel
// older than 5.11 or under a seccomp profile older than the call; else the C library's.
extern "C" __attribute__((visibility("default"))) int epoll_pwait2(int epfd, struct epoll_event* events,
                                                                   int maxevents, const struct timespec* timeout,
                                                                   const sigset_t* sigmask) {
  g_pwait2_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_pwait2_refused.load(std::memory_order_relaxed)) {
    errno = ENOSYS;
    return -1;
  }
  using Wait = int (*)(int, struct epoll_event*, int, const struct timespec*, const sigset_t*);
  static const Wait real = reinterpret_cast<Wait>(dlsym(RTLD_NEXT, "epoll_pwait2"));
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(epfd, events, maxevents, timeout, sigmask);
}

// ucp_worker_arm as the plugin sees it: UCX's own, or UCS_ERR_BUSY while g_arm_busy is set.
// This executable exports it (tests/ucx/CMakeLists.txt) and the plugin, loaded later, binds
// to it before libucp's; the case checks that the stand-in was called.
extern "C" __attribute__((visibility("default"))) ucs_status_t ucp_worker_arm(ucp_worker_h worker) {
  g_arm_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_arm_busy.load(std::memory_order_relaxed)) return UCS_ERR_BUSY;
  using Arm = ucs_status_t (*)(ucp_worker_h);
  static const Arm real = [] {
    void* ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);  // loaded by the plugin
    void* fn = dlsym(ucp != nullptr ? ucp : RTLD_NEXT, "ucp_worker_arm");
    return reinterpret_cast<Arm>(fn);
  }();
  return real != nullptr ? real(worker) : UCS_ERR_UNSUPPORTED;
}

namespace {

struct Echo {
  std::string got;  // what came back
  int rc = 1;       // the receive's end: 0, an error, or 1 when it did not end in time
  double seconds = 0;
};

// `text` to the echoing peer and back. The host posts both and then only looks (test(),
// never progress()), so the provider's thread alone moves the reply; 2 s at most. A round
// trip that did not end closes `conn` (close_conn fails what still uses `buf`, which must
// not be written after return) and sets it to null; later ones then fail at once.
Echo round_trip(const Plugin& u, void*& conn, const std::string& text) {
  Echo e;
  if (conn == nullptr) return e;
  char buf[256] = {};
  void* recv = nullptr;
  void* send = nullptr;
  const auto t0 = Clock::now();
  bool sent = false;
  if (u.p->recv_msg(u.state, conn, buf, sizeof buf, &recv) == HMC_PROV_OK &&
      u.p->send_msg(u.state, conn, text.data(), text.size(), &send) == HMC_PROV_OK) {
    size_t bytes = 0;
    char why[256];
    for (const auto until = t0 + std::chrono::seconds(2); e.rc == 1 && Clock::now() < until;) {
      int done = 0;
      if (!sent) {
        if (u.p->test(u.state, send, &done, &bytes, why, sizeof why) < 0) break;
        sent = done != 0;
      }
      if (sent) {
        const int rc = u.p->test(u.state, recv, &done, &bytes, why, sizeof why);
        if (rc < 0 || done) e.rc = rc;
        if (rc == 0 && done) e.got.assign(buf, bytes);
      }
      if (e.rc == 1) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (e.rc == 1 || !sent) {
    u.p->close_conn(u.state, conn);
    conn = nullptr;
  }
  return e;
}

// Three round trips, each of which must come back whole.
void echo_three(const Plugin& u, void*& conn, const std::string& prefix) {
  for (int i = 0; i < 3; ++i) {
    const std::string text = prefix + " " + std::to_string(i);
    Echo e = round_trip(u, conn, text);
    INFO("round trip " << i << ": " << e.seconds << " s");
    CHECK(e.rc == 0);
    CHECK(e.got == text);
  }
}

struct Idle {
  double seconds;  // how long it slept
  double spent;    // CPU seconds the provider's thread used meanwhile
};

// Sleeps `how_long` and measures what the provider's thread spent meanwhile.
Idle idle_for(std::chrono::seconds how_long) {
  const double cpu0 = ucx_test::thread_cpu_seconds("hmc-ucx");
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(how_long);
  return {std::chrono::duration<double>(Clock::now() - t0).count(), ucx_test::thread_cpu_seconds("hmc-ucx") - cpu0};
}

}  // namespace

TEST_CASE("ucx: a worker that cannot be armed costs the provider's thread little and still delivers",
          "[ucx][thread][timing]") {
  ucx_test::ScopedTls shm("shm");  // the transports of the case where the worker was seen stuck
  Peer peer(true);                 // echoes; forked before this process loads the plugin
  REQUIRE(peer.ready());
  Plugin u;
  if (u.missing()) return;
  void* far = u.connect_up(peer.addr, "far");
  REQUIRE(far != nullptr);
  struct Unstick {
    ~Unstick() { g_arm_busy = false; }
  } unstick;

  Echo armed = round_trip(u, far, "armed");
  CHECK(armed.rc == 0);
  CHECK(armed.got == "armed");

  g_arm_busy = true;
  const long calls = g_arm_calls.load();
  echo_three(u, far, "stuck");
  const auto [idle, spent] = idle_for(std::chrono::seconds(2));
  const long tries = g_arm_calls.load() - calls;
  Echo late = round_trip(u, far, "after the back-off");
  INFO("the thread used " << spent << " s of CPU in " << idle << " s idle and tried to arm " << tries
                          << " times; a round trip after that took " << late.seconds << " s");
  REQUIRE(tries > 0);              // the stand-in is what the plugin calls
  CHECK(spent < 0.05 * idle);
  CHECK(tries < 10000 * idle);  // fewer than one try per 100 us
  CHECK(late.rc == 0);
  CHECK(late.got == "after the back-off");
  CHECK(late.seconds < 1);

  g_arm_busy = false;
  Echo again = round_trip(u, far, "armed again");
  CHECK(again.rc == 0);
  CHECK(again.got == "armed again");
  REQUIRE(far != nullptr);  // else a round trip above did not end, and closed it
  CHECK(u.p->close_conn(u.state, far) == HMC_PROV_OK);
}

TEST_CASE("ucx: where epoll_pwait2 is refused, the provider's thread waits with epoll_wait and still delivers",
          "[ucx][thread][timing]") {
  Peer peer(true);  // echoes; forked before the stand-in refuses
  REQUIRE(peer.ready());
  g_pwait2_refused = true;
  struct Allow {
    ~Allow() { g_pwait2_refused = false; }
  } allow;
  const long before = g_pwait2_calls.load();
  Plugin u;
  if (u.missing()) return;
  REQUIRE(g_pwait2_calls.load() > before);  // the plugin asked the stand-in
  const long after_init = g_pwait2_calls.load();
  void* far = u.connect_up(peer.addr, "far");  // the handshake needs the thread's events
  REQUIRE(far != nullptr);
  echo_three(u, far, "no pwait2");
  const auto [idle, spent] = idle_for(std::chrono::seconds(1));
  INFO("the thread used " << spent << " s of CPU in " << idle << " s idle");
  CHECK(spent < 0.05 * idle);                       // it sleeps: no loop on a failing call
  CHECK(g_pwait2_calls.load() == after_init);      // the refusal was learnt once, at init
  REQUIRE(far != nullptr);
  CHECK(u.p->close_conn(u.state, far) == HMC_PROV_OK);
}
