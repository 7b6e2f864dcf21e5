// Bootstrap control plane, in one process: each rank is a thread with its own Bootstrap, the
// root listens on 127.0.0.1 with an ephemeral port. Catch2 assertions are not thread-safe, so
// rank threads record what they saw and the test thread checks it. Every wait has a short
// deadline so that a bug fails a test instead of hanging it.
#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "core/bootstrap.h"
#include "stderr_capture.h"

namespace {

using namespace std::chrono_literals;
using hmc::ErrorCode;
using hmc::Result;
using hmc::Status;
using hmc::core::Bootstrap;
using hmc::core::BootstrapRoot;
using hmc::core::Clock;
using hmc::core::Secret;
using Blobs = std::vector<std::vector<uint8_t>>;
namespace asio = boost::asio;

Clock::time_point in(Clock::duration d) { return Clock::now() + d; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Secret random_secret() {
  std::random_device rd;
  Secret s;
  for (auto& b : s) b = static_cast<uint8_t>(rd());
  return s;
}

// A root on loopback and the job's secret.
struct Job {
  Secret secret = random_secret();
  std::unique_ptr<BootstrapRoot> root;

  Job() {
    auto r = BootstrapRoot::start("127.0.0.1", 0, secret);
    REQUIRE(r.ok());
    root = std::move(r.value());
  }
  Result<std::unique_ptr<Bootstrap>> join(int rank, int size, Clock::duration timeout = 5s) const {
    return Bootstrap::connect("127.0.0.1", root->port(), secret, rank, size, in(timeout));
  }
};

template <class F>
void run_ranks(int size, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// The blob rank `rank` contributes to call `call`: random size in [0, 1 MiB] (the first call
// pins the extremes) and random bytes, reproducible by every rank from the seed.
std::vector<uint8_t> make_blob(uint64_t seed, int call, int rank, int size) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(call) << 32) ^ static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull);
  constexpr size_t kMiB = 1 << 20;
  size_t n = std::uniform_int_distribution<size_t>(0, kMiB)(rng);
  if (call == 0 && rank == 0) n = 0;
  if (call == 0 && rank == size - 1 && size > 1) n = kMiB;
  std::vector<uint8_t> blob(n);
  for (auto& b : blob) b = static_cast<uint8_t>(rng());
  return blob;
}

// A port that was just free: bind an ephemeral one, then release it.
uint16_t free_port() {
  auto r = BootstrapRoot::start("127.0.0.1", 0, random_secret());
  REQUIRE(r.ok());
  return r.value()->port();
}

// Sends raw bytes to the root and reports whether it hung up (without answering) within 2 s.
bool root_hangs_up(uint16_t port, const std::vector<uint8_t>& bytes) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return false;
  asio::write(s, asio::buffer(bytes), ec);
  bool hung_up = false;
  std::array<uint8_t, 64> buf{};
  s.async_read_some(asio::buffer(buf), [&](boost::system::error_code e, size_t) {
    hung_up = e == asio::error::eof || e == asio::error::connection_reset;
  });
  io.run_for(2s);
  return hung_up;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Polls a condition that another thread makes true, for at most `limit`.
template <class F>
bool eventually(F cond, Clock::duration limit = 2s) {
  const auto end = in(limit);
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("bootstrap allgather gives every rank every blob in rank order", "[bootstrap]") {
  const int size = GENERATE(1, 2, 3, 5);
  const uint64_t seed = Catch::rngSeed() * 1000003ull + static_cast<uint64_t>(size);
  constexpr int kCalls = 4;
  Job job;
  std::vector<std::string> errors(size, "rank did not run");
  run_ranks(size, [&](int rank) {
    auto boot = job.join(rank, size);
    if (!boot.ok()) {
      errors[rank] = boot.status().to_string();
      return;
    }
    Bootstrap& b = *boot.value();
    if (b.rank() != rank || b.size() != size || b.local_ip() != "127.0.0.1") {
      errors[rank] = "wrong rank, size or local ip";
      return;
    }
    for (int call = 0; call < kCalls; ++call) {
      auto all = b.allgather(make_blob(seed, call, rank, size), in(10s));
      if (!all.ok()) {
        errors[rank] = all.status().to_string();
        return;
      }
      if (all.value().size() != static_cast<size_t>(size)) {
        errors[rank] = "wrong number of blobs";
        return;
      }
      for (int r = 0; r < size; ++r) {
        if (all.value()[r] != make_blob(seed, call, r, size)) {
          errors[rank] = "call " + std::to_string(call) + ": blob of rank " + std::to_string(r) + " differs";
          return;
        }
      }
    }
    if (Status s = b.barrier(in(10s)); !s.ok()) {
      errors[rank] = s.to_string();
      return;
    }
    Status s = b.finalize(in(5s));
    errors[rank] = s.ok() ? "" : s.to_string();
  });
  for (int r = 0; r < size; ++r) {
    INFO("size " << size << ", rank " << r);
    CHECK(errors[r] == "");
  }
  Status finished = job.root->wait_finished(in(2s));
  INFO(finished.to_string());
  CHECK(finished.ok());
}

TEST_CASE("bootstrap barrier returns only after every rank entered it", "[bootstrap]") {
  constexpr int kSize = 4;
  Job job;
  std::vector<Clock::time_point> entered(kSize), left(kSize);
  std::vector<std::string> errors(kSize);
  run_ranks(kSize, [&](int rank) {
    auto boot = job.join(rank, kSize);
    if (!boot.ok()) {
      errors[rank] = boot.status().to_string();
      return;
    }
    for (int round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * ((rank + round) % kSize)));
      entered[rank] = Clock::now();
      Status s = boot.value()->barrier(in(5s));
      left[rank] = Clock::now();
      if (!s.ok()) errors[rank] = s.to_string();
    }
  });
  for (int r = 0; r < kSize; ++r) CHECK(errors[r] == "");
  // Only the last round's times were kept; nobody may leave it before the last one entered.
  const auto last_in = *std::max_element(entered.begin(), entered.end());
  for (int r = 0; r < kSize; ++r) CHECK(left[r] >= last_in);
}

TEST_CASE("bootstrap ranks that start before the root retry until it is up", "[bootstrap]") {
  constexpr int kSize = 3;
  const Secret secret = random_secret();
  const uint16_t port = free_port();
  std::vector<std::string> errors(kSize, "rank did not run");
  std::unique_ptr<BootstrapRoot> root;
  std::thread ranks([&] {
    run_ranks(kSize, [&](int rank) {
      auto boot = Bootstrap::connect("127.0.0.1", port, secret, rank, kSize, in(5s));
      if (!boot.ok()) {
        errors[rank] = boot.status().to_string();
        return;
      }
      auto all = boot.value()->allgather({static_cast<uint8_t>(rank)}, in(5s));
      errors[rank] = !all.ok() ? all.status().to_string()
                     : all.value() == Blobs{{0}, {1}, {2}} ? ""
                                                           : "wrong data";
    });
  });
  std::this_thread::sleep_for(300ms);
  auto started = BootstrapRoot::start("127.0.0.1", port, secret);
  if (started.ok()) root = std::move(started.value());
  ranks.join();
  REQUIRE(started.ok());
  for (int r = 0; r < kSize; ++r) CHECK(errors[r] == "");
}

TEST_CASE("bootstrap connect without a root times out at its deadline", "[bootstrap]") {
  const uint16_t port = free_port();
  const auto start = Clock::now();
  auto boot = Bootstrap::connect("127.0.0.1", port, random_secret(), 0, 2, in(500ms));
  const double took = seconds_since(start);
  REQUIRE_FALSE(boot.ok());
  INFO(boot.status().to_string());
  CHECK(boot.status().code() == ErrorCode::kTimeout);
  CHECK(contains(boot.status().message(), "could not join the bootstrap root"));
  CHECK(took >= 0.45);
  CHECK(took < 1.5);
}

TEST_CASE("bootstrap connect rejects bad arguments before touching the network", "[bootstrap]") {
  const Secret secret = random_secret();
  CHECK(Bootstrap::connect("127.0.0.1", 1, secret, 2, 2, in(1s)).status().code() == ErrorCode::kInvalidArgument);
  CHECK(Bootstrap::connect("127.0.0.1", 1, secret, -1, 2, in(1s)).status().code() == ErrorCode::kInvalidArgument);
  CHECK(Bootstrap::connect("127.0.0.1", 1, secret, 0, 0, in(1s)).status().code() == ErrorCode::kInvalidArgument);
  CHECK(Bootstrap::connect("", 1, secret, 0, 1, in(1s)).status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("bootstrap refuses a wrong secret and the job goes on", "[bootstrap]") {
  constexpr int kSize = 2;
  Job job;
  Secret wrong = job.secret;
  wrong[7] ^= 0x40;
  // The stranger claims rank 0 and another size first: neither may stick.
  auto stranger = Bootstrap::connect("127.0.0.1", job.root->port(), wrong, 0, 7, in(2s));
  REQUIRE_FALSE(stranger.ok());
  INFO(stranger.status().to_string());
  CHECK(stranger.status().code() == ErrorCode::kRefused);
  CHECK(contains(stranger.status().message(), "wrong job secret"));

  std::vector<std::string> errors(kSize, "rank did not run");
  run_ranks(kSize, [&](int rank) {
    auto boot = job.join(rank, kSize);
    if (!boot.ok()) {
      errors[rank] = boot.status().to_string();
      return;
    }
    auto all = boot.value()->allgather({static_cast<uint8_t>(10 + rank)}, in(5s));
    errors[rank] = !all.ok() ? all.status().to_string() : all.value() == Blobs{{10}, {11}} ? "" : "wrong data";
  });
  for (int r = 0; r < kSize; ++r) CHECK(errors[r] == "");
}

TEST_CASE("bootstrap root hangs up on garbage and oversized frames", "[bootstrap]") {
  Job job;
  const std::string http = "GET / HTTP/1.0\r\n\r\n";
  CHECK(root_hangs_up(job.root->port(), std::vector<uint8_t>(http.begin(), http.end())));
  // A hello-typed header announcing 2 GiB: refused from the header alone, nothing allocated.
  CHECK(root_hangs_up(job.root->port(), {0x00, 0x00, 0x00, 0x80, 0x01}));
  // A hello of the right length with a bad magic.
  std::vector<uint8_t> bad_magic = {32, 0, 0, 0, 1};
  bad_magic.resize(5 + 32, 0xab);
  CHECK(root_hangs_up(job.root->port(), bad_magic));

  auto boot = job.join(0, 1);
  REQUIRE(boot.ok());
  auto all = boot.value()->allgather({42}, in(5s));
  REQUIRE(all.ok());
  CHECK(all.value() == Blobs{{42}});
}

// A stranger holding connections open without a hello: past kSpareStrangers (128) plus
// the job's size the root closes the oldest for each new one, so that they can use up
// neither the descriptors of rank 0's process nor the job's way in. Before, the newcomer
// was closed: 130 idle connections kept every rank out (a rank took that as final).
TEST_CASE("bootstrap ranks join while strangers hold more idle connections than the root keeps", "[bootstrap]") {
  Job job;
  asio::io_context io;
  std::vector<std::unique_ptr<asio::ip::tcp::socket>> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<asio::ip::tcp::socket>(io));
    boost::system::error_code ec;
    idle.back()->connect({asio::ip::make_address("127.0.0.1"), job.root->port()}, ec);
    REQUIRE_FALSE(ec);
  }
  // Accepted in the background: the first one is closed once the 200th is taken.
  std::array<uint8_t, 8> buf{};
  bool first_closed = false;
  idle.front()->async_read_some(asio::buffer(buf), [&](boost::system::error_code e, size_t) {
    first_closed = e == asio::error::eof || e == asio::error::connection_reset;
  });
  io.run_for(3s);
  CHECK(first_closed);
  std::string seen[2];  // what each rank met, empty if all went well
  run_ranks(2, [&](int r) {
    auto boot = job.join(r, 2);
    if (!boot.ok()) return void(seen[r] = boot.status().to_string());
    auto all = boot.value()->allgather({static_cast<uint8_t>(r)}, in(5s));
    if (!all.ok()) seen[r] = all.status().to_string();
    else if (all.value() != Blobs{{0}, {1}}) seen[r] = "wrong blobs";
  });
  CHECK(seen[0] == "");
  CHECK(seen[1] == "");
}

TEST_CASE("bootstrap refuses a duplicate rank and a size mismatch with clear messages", "[bootstrap]") {
  Job job;
  auto rank0 = job.join(0, 2);
  REQUIRE(rank0.ok());

  auto again = job.join(0, 2, 2s);
  REQUIRE_FALSE(again.ok());
  INFO(again.status().to_string());
  CHECK(again.status().code() == ErrorCode::kRefused);
  CHECK(contains(again.status().message(), "rank 0 already joined the job"));

  auto other_size = job.join(1, 3, 2s);
  REQUIRE_FALSE(other_size.ok());
  INFO(other_size.status().to_string());
  CHECK(other_size.status().code() == ErrorCode::kMismatch);
  CHECK(contains(other_size.status().message(), "job size 3 differs from the size 2"));

  // Neither refusal took a place in the job.
  auto rank1 = job.join(1, 2);
  REQUIRE(rank1.ok());
  std::thread t([&] { (void)rank1.value()->barrier(in(5s)); });
  Status s = rank0.value()->barrier(in(5s));
  t.join();
  CHECK(s.ok());
}

TEST_CASE("bootstrap allgather times out naming the ranks it waited for", "[bootstrap]") {
  constexpr int kSize = 3;
  Job job;
  std::unique_ptr<Bootstrap> idle;  // joined, but never calls
  std::string expected;
  SECTION("a rank that never joins") { expected = "rank 2 never joined the job"; }
  // Refused for another job's secret: the others hear why, not only that it never came.
  SECTION("a rank refused for a wrong secret") {
    Secret wrong = job.secret;
    wrong[0] ^= 1;
    REQUIRE_FALSE(Bootstrap::connect("127.0.0.1", job.root->port(), wrong, 2, kSize, in(2s)).ok());
    expected = "rank 2 never joined the job (the root last refused a connection: wrong job secret (its hello names "
               "rank 2 of 3) from 127.0.0.1:";
  }
  SECTION("a rank that joins but does not call") {
    auto boot = job.join(2, kSize);
    REQUIRE(boot.ok());
    idle = std::move(boot.value());
    expected = "rank 2 joined but did not reach this call";
  }
  std::vector<Status> results(2);
  std::vector<double> took(2);
  // Kept until both ranks are done: a rank closing early would be a loss for the other.
  std::vector<std::unique_ptr<Bootstrap>> boots(2);
  run_ranks(2, [&](int rank) {
    auto boot = job.join(rank, kSize);
    if (!boot.ok()) {
      results[rank] = boot.status();
      return;
    }
    boots[rank] = std::move(boot.value());
    const auto start = Clock::now();
    results[rank] = boots[rank]->allgather({1, 2, 3}, in(1s)).status();
    took[rank] = seconds_since(start);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(results[r].to_string());
    CHECK(results[r].code() == ErrorCode::kTimeout);
    CHECK(contains(results[r].message(), expected));
    CHECK(took[r] >= 0.9);
    CHECK(took[r] < 1.5);
  }
}

TEST_CASE("bootstrap fails pending calls quickly when a rank aborts", "[bootstrap]") {
  constexpr int kSize = 3;
  Job job;
  std::vector<std::atomic<int>> changes(kSize);  // outlives the bootstraps whose callbacks count
  std::vector<std::unique_ptr<Bootstrap>> boots(kSize);
  for (int r = 0; r < kSize; ++r) {
    auto boot = job.join(r, kSize);
    REQUIRE(boot.ok());
    boots[r] = std::move(boot.value());
    boots[r]->set_on_change([&changes, r] { ++changes[r]; });
  }
  std::vector<Status> results(2);
  std::vector<double> took(2);
  Clock::time_point aborted_at;
  std::thread waiters([&] {
    run_ranks(2, [&](int rank) {
      const auto start = Clock::now();
      results[rank] = boots[rank]->allgather({static_cast<uint8_t>(rank)}, in(10s)).status();
      took[rank] = seconds_since(start);
    });
  });
  std::this_thread::sleep_for(200ms);
  aborted_at = Clock::now();
  boots[2]->abort();
  CHECK(boots[2]->allgather({2}, in(1s)).status().code() == ErrorCode::kAborted);
  waiters.join();
  const double since_abort = seconds_since(aborted_at);
  CHECK(since_abort < 2.0);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].to_string());
    CHECK(results[r].code() == ErrorCode::kPeerLost);
    CHECK(contains(results[r].message(), "rank 2 left the job without finalizing"));
    CHECK(took[r] < 2.0);
    CHECK(boots[r]->is_lost(2));
    CHECK_FALSE(boots[r]->is_lost(1 - r));
    CHECK(boots[r]->lost_peers() == std::vector<int>{2});
    CHECK(eventually([&] { return changes[r] >= 1; }));
    // Later calls fail at once.
    CHECK(boots[r]->barrier(in(1s)).code() == ErrorCode::kPeerLost);
  }
}

TEST_CASE("bootstrap tells a late joiner about ranks lost before it came", "[bootstrap]") {
  constexpr int kSize = 3;
  Job job;
  auto rank0 = job.join(0, kSize);
  auto rank2 = job.join(2, kSize);
  REQUIRE(rank0.ok());
  REQUIRE(rank2.ok());
  rank2.value()->abort();
  REQUIRE(eventually([&] { return rank0.value()->is_lost(2); }));
  auto rank1 = job.join(1, kSize);
  REQUIRE(rank1.ok());
  CHECK(eventually([&] { return rank1.value()->is_lost(2); }));
  const auto start = Clock::now();
  CHECK(rank1.value()->barrier(in(5s)).code() == ErrorCode::kPeerLost);
  CHECK(seconds_since(start) < 1.0);
}

TEST_CASE("bootstrap ranks see the control plane lost when the root goes away", "[bootstrap]") {
  std::atomic<int> changes{0};
  Job job;
  auto rank0 = job.join(0, 2);
  auto rank1 = job.join(1, 2);
  REQUIRE(rank0.ok());
  REQUIRE(rank1.ok());
  rank1.value()->set_on_change([&] { ++changes; });
  Status pending;
  double took = 0;
  std::thread waiter([&] {
    const auto start = Clock::now();
    pending = rank0.value()->allgather({1}, in(10s)).status();
    took = seconds_since(start);
  });
  std::this_thread::sleep_for(200ms);
  job.root.reset();
  waiter.join();
  INFO(pending.to_string());
  CHECK(pending.code() == ErrorCode::kPeerLost);
  CHECK(contains(pending.message(), "control plane lost: root connection closed"));
  CHECK(took < 2.0);
  CHECK(rank0.value()->is_lost(1));
  // The idle rank learns it too, and every later call fails at once.
  CHECK(eventually([&] { return rank1.value()->is_lost(0); }));
  CHECK(rank1.value()->lost_peers() == std::vector<int>{0});
  CHECK(eventually([&] { return changes >= 1; }));
  CHECK(rank1.value()->barrier(in(5s)).code() == ErrorCode::kPeerLost);
  CHECK(rank1.value()->finalize(in(1s)).code() == ErrorCode::kPeerLost);
}

TEST_CASE("bootstrap finalize is an orderly leave, not a loss", "[bootstrap]") {
  Job job;
  auto rank0 = job.join(0, 2);
  auto rank1 = job.join(1, 2);
  REQUIRE(rank0.ok());
  REQUIRE(rank1.ok());
  std::thread t([&] { (void)rank1.value()->barrier(in(5s)); });
  REQUIRE(rank0.value()->barrier(in(5s)).ok());
  t.join();

  Status unfinished = job.root->wait_finished(in(100ms));
  CHECK(unfinished.code() == ErrorCode::kTimeout);
  CHECK(contains(unfinished.message(), "ranks 0-1 did not say bye"));

  REQUIRE(rank1.value()->finalize(in(2s)).ok());
  rank1.value().reset();  // closes its connection after the bye
  std::this_thread::sleep_for(100ms);  // time for the root to see the close
  CHECK_FALSE(rank0.value()->is_lost(1));
  CHECK(rank0.value()->lost_peers().empty());

  // A call the finalized rank will never make fails at once instead of at its deadline.
  const auto start = Clock::now();
  Status s = rank0.value()->barrier(in(5s));
  INFO(s.to_string());
  CHECK(s.code() == ErrorCode::kMismatch);
  CHECK(contains(s.message(), "rank 1 finalized"));
  CHECK(seconds_since(start) < 1.0);

  // Its deadline spent (a communicator's finalize gives one for its barrier and the bye,
  // and the barrier may have waited for a late peer until then): the bye still gets its
  // round trip. It failed "after 0 ms" before.
  REQUIRE(rank0.value()->finalize(Clock::now()).ok());
  CHECK(rank0.value()->barrier(in(1s)).code() == ErrorCode::kFinalized);
  CHECK(job.root->wait_finished(in(2s)).ok());
}

TEST_CASE("bootstrap root wait_finished waits only for ranks still in the job", "[bootstrap]") {
  Job job;
  CHECK(job.root->wait_finished(in(0ms)).ok());  // nobody joined: nothing to serve

  auto rank0 = job.join(0, 3);
  REQUIRE(rank0.ok());
  const auto start = Clock::now();
  Status s = job.root->wait_finished(in(200ms));
  INFO(s.to_string());
  CHECK(s.code() == ErrorCode::kTimeout);
  CHECK(contains(s.message(), "rank 0 did not say bye"));
  CHECK(seconds_since(start) >= 0.15);

  // Once the only rank that joined is gone, ranks 1 and 2 that never came hold nothing open.
  rank0.value()->abort();
  CHECK(eventually([&] { return job.root->wait_finished(in(0ms)).ok(); }));
}

// A root whose peers reach it at a loopback address listens on loopback alone: every rank
// is on this host, and nothing outside should reach the port (it listened on 0.0.0.0
// whatever HMC_ROOT said). Any other address keeps every interface: a host name may resolve
// here to another address than the peers see (Debian's 127.0.1.1).
TEST_CASE("bootstrap roots for loopback addresses listen on loopback alone", "[bootstrap]") {
  using hmc::core::root_bind_host;
  CHECK(root_bind_host("127.0.0.1") == "127.0.0.1");
  CHECK(root_bind_host("127.0.1.1") == "127.0.1.1");
  CHECK(root_bind_host("localhost") == "127.0.0.1");
  CHECK(root_bind_host("::1") == "::1");
  CHECK(root_bind_host("10.77.1.1") == "");
  CHECK(root_bind_host("node7") == "");
  auto root = BootstrapRoot::start(root_bind_host("localhost"), 0, random_secret());
  REQUIRE(root.ok());
  // The listening socket in /proc/net/tcp: local address 0100007F (127.0.0.1), state 0A.
  char want[32];
  std::snprintf(want, sizeof want, "0100007F:%04X", root.value()->port());
  std::ifstream tcp("/proc/net/tcp");
  bool found = false;
  for (std::string line; std::getline(tcp, line);) found |= line.find(want) != std::string::npos && line.find(" 0A ") != std::string::npos;
  CHECK(found);
}

// IPv6 roots: "[addr]:port" loses its brackets for the resolver, and a root for peers that
// reach it at an IPv6 address listens on "::" for both families (it listened on IPv4's
// 0.0.0.0, and every rank's connect was refused until HMC_TIMEOUT).
TEST_CASE("bootstrap over IPv6: bracketed roots, and a dual-stack root", "[bootstrap]") {
  using hmc::core::parse_root;
  using hmc::core::root_bind_host;
  std::ifstream inet6("/proc/net/if_inet6");  // lo's ::1 is 000...01
  std::string all((std::istreambuf_iterator<char>(inet6)), std::istreambuf_iterator<char>());
  if (all.find("00000000000000000000000000000001 ") == std::string::npos) {
    WARN("no IPv6 loopback here: skipped");
    return;
  }
  auto bracketed = parse_root("[fd00::1]:29500");
  REQUIRE(bracketed.ok());
  CHECK(bracketed->host == "fd00::1");
  CHECK(bracketed->port == 29500);
  CHECK(parse_root("fd00::1:29501")->host == "fd00::1");  // MASTER_ADDR=fd00::1 as from_env joins it
  CHECK(root_bind_host("fd00::1") == "::");
  CHECK(root_bind_host("[::1]") == "::1");
  const Secret secret = random_secret();
  auto root = BootstrapRoot::start(root_bind_host("fd00::1"), 0, secret);
  REQUIRE(root.ok());
  const uint16_t port = root.value()->port();
  // One rank over IPv6 loopback, one over IPv4's: both reach the "::" root.
  const std::string hosts[] = {parse_root("[::1]:" + std::to_string(port))->host, "127.0.0.1"};
  std::string seen[2];  // what each rank met, empty if all went well (Catch is not for threads)
  run_ranks(2, [&](int rank) {
    auto b = Bootstrap::connect(hosts[rank], port, secret, rank, 2, in(5s));
    if (!b.ok()) return void(seen[rank] = "join via " + hosts[rank] + ": " + b.status().to_string());
    auto all = b.value()->allgather({static_cast<uint8_t>(rank)}, in(5s));
    if (!all.ok()) return void(seen[rank] = all.status().to_string());
    if (all.value() != Blobs{{0}, {1}}) return void(seen[rank] = "wrong blobs");
    if (Status s = b.value()->finalize(in(5s)); !s.ok()) seen[rank] = "finalize: " + s.to_string();
  });
  CHECK(seen[0] == "");
  CHECK(seen[1] == "");
}

// Rank 0 of from_env starts the root wherever it runs; an HMC_ROOT naming another host
// then leaves every rank dialling nowhere, so rank 0 warns when the address is not its own.
TEST_CASE("bootstrap tells this host's addresses from others", "[bootstrap]") {
  using hmc::core::is_local_address;
  CHECK(is_local_address("127.0.0.1"));
  CHECK(is_local_address("localhost"));
  CHECK_FALSE(is_local_address("198.51.100.254"));  // TEST-NET-2, for documentation only
  CHECK(is_local_address("no-such-host.invalid"));  // not resolved: the connect says so
}

// A flood of bad connections costs the root's log one line each up to ten a second, then
// one line for the rest (130 strangers wrote 130 warnings at once).
TEST_CASE("bootstrap root logs refused connections ten a second, then counts them", "[bootstrap]") {
  Job job;
  const std::string http = "GET / HTTP/1.0\r\n\r\n";
  int hung_up = 0;
  const std::string text = hmc::test::stderr_of([&] {
    for (int i = 0; i < 30; ++i) hung_up += root_hangs_up(job.root->port(), std::vector<uint8_t>(http.begin(), http.end()));
    std::this_thread::sleep_for(1500ms);  // a sweep says how many more
  });
  INFO(text);
  CHECK(hung_up == 30);
  std::size_t lines = 0;
  for (std::size_t at = 0; (at = text.find("refused bootstrap connection from", at)) != std::string::npos; ++at) ++lines;
  CHECK(lines <= 10);
  CHECK(contains(text, "more bootstrap connection(s) in the last second"));
}
