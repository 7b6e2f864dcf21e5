// The events count (net.h): every request's end moves it, after test can see the end.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstddef>
#include <thread>

#include "net_kit.h"

using namespace hmc_conformance;

namespace {

bool has_events(const Session& s) {
  return s.p->struct_size >= offsetof(hmc_net_provider_t, events) + sizeof(s.p->events) && s.p->events != nullptr;
}

// Follows `req` of `s` to its end as a host that skips its tests while the count stands
// would: a test that finds it pending is followed by a wait for the count to move (driving
// both sessions), and the count must move before the request can be seen to end.
// Returns the end's rc; fails the test case where the count stood still past the deadline
// (the end would never have been tested) or went back.
int follow(Session& s, Session& other, void* req) {
  const auto deadline = Clock::now() + timeout();
  uint64_t count = s.p->events(s.state);
  for (;;) {
    int done = 0;
    size_t bytes = 0;
    char message[256] = {};
    const int rc = s.p->test(s.state, req, &done, &bytes, message, sizeof(message));
    if (rc != HMC_PROV_OK || done) return rc;
    uint64_t now = count;
    while (now == count && Clock::now() < deadline) {
      s.p->progress(s.state);
      other.p->progress(other.state);
      std::this_thread::yield();
      now = s.p->events(s.state);
    }
    INFO(s.p->name << ": a pending request's end never moved the events count");
    REQUIRE(now != count);
    REQUIRE(now > count);  // it only grows
    count = now;
  }
}

// The count once it passed `before`, or as it stands at the deadline. An end that `test`
// already reported may still be on its way into the count: the provider moves it right
// after the end, possibly on another thread.
uint64_t count_past(Session& s, uint64_t before) {
  const auto deadline = Clock::now() + timeout();
  uint64_t now = s.p->events(s.state);
  while (now <= before && Clock::now() < deadline) {
    std::this_thread::yield();
    now = s.p->events(s.state);
  }
  return now;
}

}  // namespace

// net.h has the count move after an end is visible to `test`: the checks wait (count_past).
TEST_CASE("net: every request's end moves the events count", "[net][events]") {
  for_each_plugin([](Session& s) {
    if (!has_events(s)) {
      WARN(s.p->name << " has no events count: the host tests every request in every pass");
      return;
    }
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    uint64_t salt = 7;
    // Completions: receives posted before their message, sends, both ways, small and large.
    for (size_t size : {size_t{8}, size_t{64} << 10, size_t{4} << 20}) {
      INFO("message of " << size << " bytes");
      const auto data = random_bytes(size, ++salt);
      Recv r;
      post_recv(t, link.b, r, size);
      const uint64_t before = s.p->events(s.state);
      void* sreq = post_send(s, link.a, data);
      CHECK(follow(t, s, r.req) == HMC_PROV_OK);
      CHECK(first_diff(r.buf.data(), data.data(), size) == size);
      CHECK(follow(s, t, sreq) == HMC_PROV_OK);
      CHECK(count_past(s, before) > before);
      const auto back = random_bytes(size, ++salt);
      Recv r2;
      post_recv(s, link.a, r2, size);
      void* sreq2 = post_send(t, link.b, back);
      CHECK(follow(s, t, r2.req) == HMC_PROV_OK);
      CHECK(follow(t, s, sreq2) == HMC_PROV_OK);
    }
    // Failures: a receive pending when its peer closes the connection.
    Recv pending;
    post_recv(t, link.b, pending, 100);
    const uint64_t before = t.p->events(t.state);
    REQUIRE(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
    CHECK(follow(t, s, pending.req) == HMC_PROV_ERR_PEER_LOST);
    CHECK(count_past(t, before) > before);
    CHECK(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
    CHECK(t.p->close_listener(t.state, link.listener) == HMC_PROV_OK);
  });
}
