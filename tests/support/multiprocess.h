// Runs a test body in real processes, one per rank, and always reaps them.
//
// The parent forks `size` children. Rank 0 creates the unique id (its bootstrap root lives
// in rank 0's process) and hands it to the others through pipes. Every child runs the body
// and exits with its return value; a child that outlives the deadline is SIGKILLed. Bodies
// report failures with HMC_EXPECT (prints to stderr, returns 1): Catch2 lives in the parent.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hmc/hmc.h"

namespace hmc::test {

struct RankExit {
  int rank = -1;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string describe() const;
};

struct RankEnv {
  int rank;
  int size;
  Context& ctx;
  Communicator& comm;
};

// Settings go to every rank's ContextOptions ("{rank}" in a value becomes the rank). The body runs after the communicator is up;
// finalize happens after it unless the body returned non-zero or the comm was finalized.
std::vector<RankExit> run_ranks(int size, const std::map<std::string, std::string>& settings,
                                const std::function<int(RankEnv&)>& body,
                                std::chrono::seconds deadline = std::chrono::seconds(60));

// Lower-level: runs body(rank) in forked children with no HMC set-up at all.
std::vector<RankExit> run_processes(int n, const std::function<int(int)>& body, std::chrono::seconds deadline);

bool all_ok(const std::vector<RankExit>& exits);
std::string describe(const std::vector<RankExit>& exits);

// Deterministic random bytes for a (seed, rank, size) triple.
std::vector<uint8_t> random_bytes(std::size_t n, uint64_t seed);

// Whether `live` holds `want`'s n bytes yet, for a test that waits for a transfer in flight
// to land: a provider's thread may be writing `live` as this reads it, so the reads are kept
// out of ThreadSanitizer's sight. Not a check of the data: check again once the request ended.
bool landed(const void* live, const void* want, std::size_t n);

// The net providers a default Context finds available, for parameterising tests.
std::vector<std::string> available_net_providers();

}  // namespace hmc::test

#define HMC_EXPECT(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "[pid %d] %s:%d: expected %s: ", getpid(), __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "%s\n", ::hmc::test::format_detail(__VA_ARGS__).c_str());      \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

#define HMC_EXPECT_OK(expr)                                                               \
  do {                                                                                     \
    ::hmc::Status hmc_s_ = (expr);                                                         \
    HMC_EXPECT(hmc_s_.ok(), hmc_s_.to_string());                                           \
  } while (0)

namespace hmc::test {
inline std::string format_detail() { return ""; }
inline std::string format_detail(const std::string& s) { return s; }
inline std::string format_detail(const char* s) { return s; }
}  // namespace hmc::test
