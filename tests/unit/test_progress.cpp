// The progress engine's list: an item taken off it is never called again once remove()
// returned, even by a pass that another thread started before (core/progress.h).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "core/progress.h"

namespace {

using namespace std::chrono_literals;

// Each call takes a while, so a pass on another thread is often inside or just before one
// when the item is removed; a call after `dead` is set is the fault this test looks for.
class SlowItem : public hmc::core::Progressable {
 public:
  explicit SlowItem(std::chrono::microseconds t) : takes(t) {}
  bool progress() override {
    if (dead.load()) late_calls.fetch_add(1);
    calls.fetch_add(1);
    std::this_thread::sleep_for(takes);
    return false;
  }
  const std::chrono::microseconds takes;
  std::atomic<bool> dead{false};
  std::atomic<int> calls{0};
  std::atomic<int> late_calls{0};
};

// Removes itself from inside its own call, as the collectives' driver does when idle.
class SelfRemoving : public hmc::core::Progressable {
 public:
  explicit SelfRemoving(hmc::core::ProgressEngine& e) : engine(e) {}
  bool progress() override {
    calls.fetch_add(1);
    engine.remove(this);
    return true;
  }
  hmc::core::ProgressEngine& engine;
  std::atomic<int> calls{0};
};

}  // namespace

TEST_CASE("remove waits for passes that may still call the item", "[progress]") {
  hmc::core::ProgressEngine engine;
  // Stays on the list ahead of each round's item, and takes long: the poller's next pass
  // has copied the list and sits in here when the round's item is removed.
  SlowItem ahead(300us);
  engine.add(&ahead);
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop.load()) engine.progress();
  });
  int rounds = 0, called = 0, late = 0;
  for (; rounds < 200; ++rounds) {
    SlowItem item(10us);
    engine.add(&item);
    const auto until = std::chrono::steady_clock::now() + 1s;
    while (item.calls.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    called += item.calls.load() > 0 ? 1 : 0;
    std::this_thread::sleep_for(100us);  // the poller is into its next pass, in `ahead`
    engine.remove(&item);
    item.dead = true;  // from here on a call would reach a freed item
    std::this_thread::sleep_for(400us);  // past the pass in `ahead`
    late += item.late_calls.load();
  }
  stop = true;
  poller.join();
  CHECK(late == 0);
  CHECK(called > rounds / 2);  // the poller really ran the items
}

TEST_CASE("an item may remove itself from inside its own progress", "[progress]") {
  hmc::core::ProgressEngine engine;
  SelfRemoving item(engine);
  engine.add(&item);
  CHECK(engine.progress());  // returns: the removal does not wait for its own pass
  CHECK(item.calls.load() == 1);
  engine.progress();
  CHECK(item.calls.load() == 1);  // off the list
}

TEST_CASE("a wait with the longest timeout waits instead of timing out at once", "[progress]") {
  using hmc::core::deadline_after;
  const auto before = std::chrono::steady_clock::now();
  CHECK(deadline_after(std::chrono::milliseconds::max()) == hmc::Clock::time_point::max());
  CHECK(deadline_after(std::chrono::hours::max()) == hmc::Clock::time_point::max());
  const auto passed = deadline_after(-5s);
  CHECK(passed <= std::chrono::steady_clock::now());
  const auto in_a_second = deadline_after(1s);
  CHECK(in_a_second >= before + 1s);
  CHECK(in_a_second <= std::chrono::steady_clock::now() + 1s);

  auto engine = std::make_shared<hmc::core::ProgressEngine>();
  auto op = hmc::core::Operation::make(engine);
  std::thread finisher([&] {
    std::this_thread::sleep_for(100ms);
    op->complete(7);
    engine->wake();
  });
  hmc::Request r(op);
  const auto t0 = std::chrono::steady_clock::now();
  hmc::Status s = r.wait(std::chrono::milliseconds::max());
  finisher.join();
  CHECK(s.ok());
  CHECK(r.bytes() == 7);
  CHECK(std::chrono::steady_clock::now() - t0 >= 90ms);
}

// After ~ContextImpl the engine is closed and its pollers point at providers that are gone:
// a Request the application still holds must not make a pass.
TEST_CASE("a request of a closed engine fails with kFinalized and makes no pass", "[progress]") {
  auto engine = std::make_shared<hmc::core::ProgressEngine>();
  std::atomic<int> polls{0};
  engine->add_poller([&] {
    polls.fetch_add(1);
    return false;
  });
  hmc::Request r(hmc::core::Operation::make(engine));
  CHECK_FALSE(r.test());
  CHECK(polls.load() == 1);
  engine->close();
  CHECK_FALSE(r.test());
  CHECK(r.wait(1s).code() == hmc::ErrorCode::kFinalized);
  CHECK(r.wait().code() == hmc::ErrorCode::kFinalized);
  CHECK(polls.load() == 1);
}
