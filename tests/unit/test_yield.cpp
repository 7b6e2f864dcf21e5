// How often a waiter yields the CPU (core/progress.h): between yields it polls back to back
// only where the host leaves every rank a CPU, and for messages over providers with threads
// of their own (no HMC_NET_CAP_POLLED) a second one for that thread, within the rank's own
// CPU binding too.
#include <sched.h>

#include <catch2/catch.hpp>
#include <thread>

#include "core/context_impl.h"
#include "core/progress.h"

namespace {

using hmc::core::ContextImpl;

std::unique_ptr<ContextImpl> make(std::map<std::string, std::string> settings = {}) {
  settings.emplace("HMC_PROVIDERS", "cpu");
  auto ctx = ContextImpl::create({settings});
  REQUIRE(ctx.ok());
  return std::move(ctx.value());
}

// Binds the calling thread to its first allowed CPU while in scope.
class OneCpu {
 public:
  OneCpu() {
    REQUIRE(sched_getaffinity(0, sizeof saved_, &saved_) == 0);
    int first = 0;
    while (!CPU_ISSET(first, &saved_)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  }
  ~OneCpu() { sched_setaffinity(0, sizeof saved_, &saved_); }
  OneCpu(const OneCpu&) = delete;
  OneCpu& operator=(const OneCpu&) = delete;

 private:
  cpu_set_t saved_;
};

int allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return CPU_COUNT(&set);
}

}  // namespace

TEST_CASE("a waiter yields after every poll where ranks would crowd the CPUs", "[progress][yield]") {
  auto ctx = make();
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx->note_host_ranks(cpus, true);  // a CPU for each rank, none for their helper threads
  CHECK(ctx->engine()->yield_every() == 8);
  CHECK(ctx->engine()->message_yield_every() == 1);
  ctx->note_host_ranks(cpus + 1, true);
  CHECK(ctx->engine()->yield_every() == 1);
  CHECK(ctx->engine()->message_yield_every() == 1);
  ctx->note_host_ranks(1, false);  // the busiest communicator counts: nothing changes
  CHECK(ctx->engine()->yield_every() == 1);
  CHECK(ctx->engine()->message_yield_every() == 1);
}

TEST_CASE("over providers that need no thread of their own a rank's CPU is room enough", "[progress][yield]") {
  auto ctx = make();
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  {
    OneCpu bound;  // no helper thread to share it with
    ctx->note_host_ranks(cpus, false);
  }
  CHECK(ctx->engine()->yield_every() == 8);
  CHECK(ctx->engine()->message_yield_every() == 8);
  // One communicator whose paths need helpers is enough: every wait may be on it.
  ctx->note_host_ranks(1, true);
  CHECK(ctx->engine()->yield_every() == 8);
  CHECK(ctx->engine()->message_yield_every() == 1);
  ctx->note_host_ranks(1, false);
  CHECK(ctx->engine()->message_yield_every() == 1);
}

TEST_CASE("a rank alone with helpers polls 8 times between yields unless bound to one CPU", "[progress][yield]") {
  if (allowed() >= 2 && std::thread::hardware_concurrency() >= 2) {
    auto ctx = make();
    ctx->note_host_ranks(1, true);
    CHECK(ctx->engine()->yield_every() == 8);
    CHECK(ctx->engine()->message_yield_every() == 8);
  }
  OneCpu bound;  // as a launcher that binds each rank to a core leaves it
  auto ctx = make();
  CHECK(ctx->engine()->message_yield_every() == 8);  // no communicator yet: no helpers
  ctx->note_host_ranks(1, true);
  CHECK(ctx->engine()->yield_every() == 8);
  CHECK(ctx->engine()->message_yield_every() == 1);
}

TEST_CASE("HMC_YIELD_EVERY sets both counts", "[progress][yield]") {
  auto ctx = make({{"HMC_YIELD_EVERY", "3"}});
  ctx->note_host_ranks(1000, true);
  CHECK(ctx->engine()->yield_every() == 3);
  CHECK(ctx->engine()->message_yield_every() == 3);
}

// The count is an int, and a waiter polls 200 times that before it sleeps: 4294967296 came
// out as 0 (then 1), and 20000000 overflowed the product. Values past 2^20 are refused.
TEST_CASE("HMC_YIELD_EVERY past its range is refused, not wrapped", "[progress][yield]") {
  for (const char* bad : {"4294967296", "20000000", "-1"}) {
    INFO(bad);
    auto ctx = ContextImpl::create({{{"HMC_PROVIDERS", "cpu"}, {"HMC_YIELD_EVERY", bad}}});
    REQUIRE_FALSE(ctx.ok());
    CHECK_THAT(ctx.status().message(), Catch::Contains("HMC_YIELD_EVERY"));
  }
  CHECK(make({{"HMC_YIELD_EVERY", "1048576"}})->engine()->yield_every() == 1048576);
}
