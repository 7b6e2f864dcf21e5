// When a communicator's pass tests its peers' requests (core/events_watch.h), and the
// events count of the shared provider code that it relies on (common/request.h).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <thread>

#include "common/request.h"
#include "core/events_watch.h"

using hmc::core::EventsWatch;

namespace {

uint64_t read_count(void* state) { return *static_cast<uint64_t*>(state); }

// Passes until one is due, at most `limit`; how many were not.
unsigned skipped_until_due(EventsWatch& w, unsigned limit) {
  unsigned n = 0;
  while (n < limit && !w.due()) ++n;
  return n;
}

}  // namespace

TEST_CASE("events watch: a pass tests only after a count moved, when asked, or now and then", "[unit][events]") {
  uint64_t a = 5, b = 0;
  EventsWatch w;
  w.watch(read_count, &a);
  w.watch(read_count, &b);
  CHECK(w.due());  // the first pass tests
  CHECK_FALSE(w.due());
  CHECK_FALSE(w.due());
  ++b;  // a request of the second provider ended
  CHECK(w.due());
  CHECK_FALSE(w.due());
  a += 3;
  CHECK(w.due());
  CHECK_FALSE(w.due());
  w.rescan();  // the core's own work (a held send)
  CHECK(w.due());
  CHECK_FALSE(w.due());
  // Counts standing still: a pass tests every kLookEvery-th time all the same.
  CHECK(skipped_until_due(w, 1000) == EventsWatch::kLookEvery - 2);
  CHECK(skipped_until_due(w, 1000) == EventsWatch::kLookEvery - 1);
  // A count that moves while passes are skipped is seen by the next one.
  for (int i = 0; i < 10; ++i) CHECK_FALSE(w.due());
  ++a;
  CHECK(w.due());
}

TEST_CASE("events watch: a provider without a count makes every pass test", "[unit][events]") {
  uint64_t a = 0;
  EventsWatch w;
  w.watch(read_count, &a);
  w.watch(nullptr, nullptr);
  for (int i = 0; i < 200; ++i) CHECK(w.due());
  w.clear();
  w.watch(read_count, &a);
  CHECK(w.due());  // a fresh count is read once, then stands
  CHECK_FALSE(w.due());
}

TEST_CASE("request table: each end moves the count after test can see it", "[unit][events]") {
  hmc_net::RequestTable table;
  const uint64_t start = table.ends();
  hmc_net::Request* done = table.create();
  hmc_net::Request* failed = table.create();
  hmc_net::Request* pending = table.create();
  CHECK(table.ends() == start);  // made, not ended
  done->complete(3);
  CHECK(table.ends() == start + 1);
  failed->fail(HMC_PROV_ERR_PEER_LOST, "gone");
  CHECK(table.ends() == start + 2);
  int is_done = 0;
  size_t bytes = 0;
  char message[32] = {};
  CHECK(table.test(done, &is_done, &bytes, message, sizeof(message)) == HMC_PROV_OK);
  CHECK(is_done == 1);
  CHECK(bytes == 3);
  CHECK(table.test(failed, &is_done, &bytes, message, sizeof(message)) == HMC_PROV_ERR_PEER_LOST);
  CHECK(table.test(pending, &is_done, &bytes, message, sizeof(message)) == HMC_PROV_OK);
  CHECK(is_done == 0);
  CHECK(table.ends() == start + 2);  // tests end nothing
  // An end on another thread: whoever sees the count move sees the end.
  std::thread t([&] { pending->complete(7); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool moved = false;
  while (!(moved = table.ends() != start + 2) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  const int rc = moved ? table.test(pending, &is_done, &bytes, message, sizeof(message)) : HMC_PROV_ERR_INTERNAL;
  t.join();  // before any REQUIRE: a joinable thread must not be destroyed
  REQUIRE(moved);
  CHECK(rc == HMC_PROV_OK);
  CHECK(is_done == 1);
  CHECK(bytes == 7);
  // A request handed out again counts its next end too.
  hmc_net::Request* again = table.create();
  again->complete(0);
  CHECK(table.ends() == start + 4);
  CHECK(table.test(again, &is_done, &bytes, message, sizeof(message)) == HMC_PROV_OK);
}
