// idle (net.h): once the host said it stops polling and made its one pass after that, a
// message that arrives is announced with host->wake, and no further progress call is
// needed for its receive to end.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstddef>
#include <thread>

#include "net_kit.h"

using namespace hmc_conformance;

namespace {

bool has_idle(const Session& s) {
  return s.p->struct_size >= offsetof(hmc_net_provider_t, idle) + sizeof(s.p->idle) && s.p->idle != nullptr;
}

// Tests `req` of `s` without progressing `s`; drives `other` (the sender) meanwhile.
Outcome watch(Session& s, Session& other, void* req) {
  Outcome out;
  const auto deadline = Clock::now() + timeout();
  for (;;) {
    int done = 0;
    char message[256] = {};
    out.rc = s.p->test(s.state, req, &done, &out.bytes, message, sizeof(message));
    out.done = done != 0;
    out.message = message;
    if (out.rc != HMC_PROV_OK || out.done) return out;
    if (Clock::now() >= deadline) {
      out.timed_out = true;
      return out;
    }
    other.p->progress(other.state);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

TEST_CASE("net: after idle, what arrives wakes the host and ends without more progress", "[net][idle]") {
  for_each_plugin([](Session& s) {
    if (!has_idle(s)) {
      WARN(s.p->name << " has no idle: the host's waiter sleeps at most 200 us before it polls again");
      return;
    }
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    uint64_t salt = 11;
    for (size_t size : {size_t{8}, size_t{64} << 10}) {
      for (int round = 0; round < 10; ++round) {
        INFO(s.p->name << ": message of " << size << " bytes, round " << round);
        const auto data = random_bytes(size, ++salt);
        Recv r;
        post_recv(t, link.b, r, size);
        // The receiver polls, its calls close together (a provider may take it as polling
        // and hold back wakes), then says it stops and makes its one pass.
        const auto polled_until = Clock::now() + std::chrono::microseconds(500);
        while (Clock::now() < polled_until) t.p->progress(t.state);
        t.p->idle(t.state);
        t.p->progress(t.state);
        const uint64_t woken = t.wakes();
        // The message comes at once, inside the time a stamp of polling stays fresh.
        void* sreq = post_send(s, link.a, data);
        Outcome o = watch(t, s, r.req);
        INFO("rc " << o.rc << " " << o.message);
        REQUIRE_FALSE(o.timed_out);  // nothing read it: the provider waited for a poll
        REQUIRE(o.rc == HMC_PROV_OK);
        CHECK(o.bytes == size);
        CHECK(first_diff(r.buf.data(), data.data(), size) == size);
        // The end was announced: the wake comes after the request ended (a ucx provider's
        // thread calls it once it let go of its lock), so `test` may have seen the end first.
        CHECK(t.wakes_past(woken, timeout()) > woken);
        check_sent(s, sreq, size);
      }
    }
    CHECK(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
    CHECK(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
    CHECK(t.p->close_listener(t.state, link.listener) == HMC_PROV_OK);
  });
}
