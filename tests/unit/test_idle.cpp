// A waiter that stops polling tells the providers so (net.h's idle; core/progress.h): it
// calls every poller's idle, makes exactly one pass after it, and then sleeps its full
// length, since the providers now wake it. Where one poller has no idle, nobody is told.
#include <catch2/catch.hpp>
#include <chrono>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "core/progress.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What a provider saw, in order: its progress calls ('p') and idle calls ('i').
struct Log {
  struct Event {
    char what;
    Clock::time_point at;
  };
  std::mutex mu;
  std::vector<Event> events;
  void add(char what) {
    std::lock_guard lock(mu);
    events.push_back({what, Clock::now()});
  }
};

}  // namespace

TEST_CASE("a waiter that stops polling tells the providers, passes once, then sleeps long", "[progress][idle]") {
  // A waiter tells only when its last polls came close together; on a loaded machine a
  // yield between polls may take milliseconds, so it tries again (up to 5 s) until one did.
  int told = 0, tries = 0;
  for (const auto give_up = Clock::now() + 5s; told == 0 && Clock::now() < give_up; ++tries) {
    hmc::core::ProgressEngine engine;
    Log log;
    engine.add_poller([&] { log.add('p'); return false; }, [&] { log.add('i'); });
    const auto start = Clock::now();
    CHECK_FALSE(engine.wait_until([] { return false; }, start + 20ms));
    std::lock_guard lock(log.mu);
    const auto& ev = log.events;
    for (size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].what != 'i') continue;
      ++told;
      INFO("idle call " << told << ", at event " << i << " of " << ev.size());
      // Told after a poll, never twice in a row.
      REQUIRE(i >= 1);
      CHECK(ev[i - 1].what == 'p');
      // Exactly one pass after it, then the sleep: 1 ms unless the deadline comes first,
      // not the 200 us that a waiter whose providers cannot be told sleeps first.
      if (i + 2 >= ev.size()) continue;  // the deadline ended the wait here
      CHECK(ev[i + 1].what == 'p');
      const auto slept = ev[i + 2].at - ev[i + 1].at;
      const auto left = start + 20ms - ev[i + 1].at;
      CHECK(slept >= std::min<Clock::duration>(900us, left - 50us));
    }
  }
  INFO("tries: " << tries);
  CHECK(told >= 1);
}

TEST_CASE("where one provider has no idle, none is told and the first sleep is short", "[progress][idle]") {
  hmc::core::ProgressEngine engine;
  Log told, silent;
  engine.add_poller([&] { told.add('p'); return false; }, [&] { told.add('i'); });
  engine.add_poller([&] { silent.add('p'); return false; });
  CHECK_FALSE(engine.wait_until([] { return false; }, Clock::now() + 10ms));
  std::lock_guard lock(told.mu);
  int idles = 0;
  for (const auto& e : told.events) idles += e.what == 'i' ? 1 : 0;
  CHECK(idles == 0);
  CHECK_FALSE(told.events.empty());  // the provider was polled all the same
}

// An idle call reaches into the provider's state, which the context frees once the engine's
// close() returned: close() must wait for an idle call under way, as for a pass. It did not
// (the idlers ran before the counted pass), and a waiter woken by an abort could call into
// an unloaded provider.
TEST_CASE("close waits for an idle call under way", "[progress][idle]") {
  int entered = 0, tries = 0;
  std::atomic<int> late{0};
  for (const auto give_up = Clock::now() + 5s; entered == 0 && Clock::now() < give_up; ++tries) {
    hmc::core::ProgressEngine engine;
    std::atomic<bool> in_idle{false}, closed{false};
    engine.add_poller([] { return false; }, [&] {
      in_idle = true;
      std::this_thread::sleep_for(50ms);  // close() runs meanwhile
      if (closed.load()) late.fetch_add(1);
    });
    std::thread waiter([&] { engine.wait_until([] { return false; }, Clock::now() + 300ms); });
    while (!in_idle.load() && Clock::now() < give_up) std::this_thread::sleep_for(100us);
    if (in_idle.load()) {
      ++entered;
      engine.close();
      closed = true;
    }
    waiter.join();
  }
  INFO("tries: " << tries);
  REQUIRE(entered >= 1);
  CHECK(late.load() == 0);
}
