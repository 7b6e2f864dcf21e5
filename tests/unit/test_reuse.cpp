// Storage that the message path reuses instead of allocating: the net providers'
// request table (net-providers/common/request.h), operations (core/progress.h) and the
// collectives' bookkeeping vectors (collectives/reuse.h).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "collectives/reuse.h"
#include "collectives/scratch.h"
#include "common/request.h"
#include "core/progress.h"

using hmc_net::Request;
using hmc_net::RequestTable;

TEST_CASE("request table hands released requests out again, fresh", "[reuse]") {
  RequestTable table;
  Request* a = table.create();
  a->fail(HMC_PROV_ERR_PEER_LOST, "gone");
  char msg[64] = {0};
  int done = -1;
  CHECK(table.test(a, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_PEER_LOST);
  CHECK(std::string(msg) == "gone");
  CHECK(done == 0);

  // Released: the handle is unknown until the table hands the request out again.
  std::memset(msg, 0, sizeof msg);
  CHECK(table.test(a, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
  CHECK(std::string(msg).find("unknown request") != std::string::npos);

  Request* b = table.create();
  CHECK(b == a);  // reused, with none of the old request's state
  CHECK(b->state.load() == HMC_PROV_IN_PROGRESS);
  CHECK(b->message.empty());
  CHECK(b->bytes == 0);
  CHECK(table.test(b, &done, nullptr, msg, sizeof msg) == HMC_PROV_OK);
  CHECK(done == 0);
  b->complete(42);
  size_t bytes = 0;
  CHECK(table.test(b, &done, &bytes, msg, sizeof msg) == HMC_PROV_OK);
  CHECK(done == 1);
  CHECK(bytes == 42);

  // A pointer the table never made is refused, even next to its own.
  Request stranger;
  CHECK(table.test(&stranger, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);

  // Many in flight at once: all distinct, all tested to completion, then reused.
  std::vector<Request*> live;
  for (int i = 0; i < 100; ++i) live.push_back(table.create());
  CHECK(std::set<Request*>(live.begin(), live.end()).size() == live.size());
  for (std::size_t i = 0; i < live.size(); ++i) live[i]->complete(i);
  for (std::size_t i = 0; i < live.size(); ++i) {
    CHECK(table.test(live[i], &done, &bytes, msg, sizeof msg) == HMC_PROV_OK);
    CHECK(bytes == i);
  }
  std::set<Request*> again;
  for (int i = 0; i < 100; ++i) again.insert(table.create());
  CHECK(again == std::set<Request*>(live.begin(), live.end()));

  // discard forgets a request that was never handed to anyone.
  Request* c = table.create();
  table.discard(c);
  CHECK(table.test(c, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
}

// test() answers "pending" without the table's lock; what it refuses must stay refused,
// across the table's chunks, and a completion on another thread must reach the poller.
TEST_CASE("request table: pending without the lock, unknown handles still refused", "[reuse]") {
  RequestTable table;
  char msg[64] = {0};
  int done = -1;
  size_t bytes = 0;
  std::vector<Request*> reqs;
  for (int i = 0; i < 1000; ++i) reqs.push_back(table.create());  // several chunks
  for (Request* r : reqs) {
    CHECK(table.test(r, &done, &bytes, msg, sizeof msg) == HMC_PROV_OK);
    CHECK(done == 0);
  }
  // Inside a chunk but not at a request: refused, as is one byte past the first.
  CHECK(table.test(reinterpret_cast<char*>(reqs[0]) + 1, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
  CHECK(table.test(reinterpret_cast<char*>(reqs[999]) + 8, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
  // A slot of the last chunk never handed out yet: refused.
  CHECK(table.test(reqs[999] + 1, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
  std::thread completer([&] {
    for (std::size_t i = 0; i < reqs.size(); ++i) reqs[i]->complete(i + 1);
  });
  std::size_t seen = 0;
  std::vector<bool> finished(reqs.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen < reqs.size() && std::chrono::steady_clock::now() < deadline)
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (finished[i]) continue;
      REQUIRE(table.test(reqs[i], &done, &bytes, msg, sizeof msg) == HMC_PROV_OK);
      if (!done) continue;
      CHECK(bytes == i + 1);
      finished[i] = true;
      ++seen;
    }
  completer.join();
  REQUIRE(seen == reqs.size());  // every completion reached the poller within the deadline
  // Released, and discarded before anyone saw them: refused, not "pending".
  for (Request* r : reqs) CHECK(table.test(r, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
  Request* d = table.create();
  table.discard(d);
  CHECK(table.test(d, &done, nullptr, msg, sizeof msg) == HMC_PROV_ERR_INVALID);
}

TEST_CASE("operations reuse their memory and start pending", "[reuse]") {
  auto engine = std::make_shared<hmc::core::ProgressEngine>();
  auto first = hmc::core::Operation::make(engine);
  first->fail(hmc::Status(hmc::ErrorCode::kTimeout, "late"));
  const void* where = first.get();
  first.reset();
  auto second = hmc::core::Operation::make(engine);
  CHECK(static_cast<const void*>(second.get()) == where);
  CHECK_FALSE(second->done());
  CHECK(second->status().ok());
  second->complete(8);
  CHECK(second->done());
  CHECK(second->bytes() == 8);

  // An operation made on one thread and dropped on another is fine either way.
  std::shared_ptr<hmc::core::Operation> moved;
  std::thread([&] { moved = hmc::core::Operation::make(engine); }).join();
  moved->complete(1);
  moved.reset();
  auto third = hmc::core::Operation::make(engine);
  CHECK_FALSE(third->done());
}

TEST_CASE("shelved vectors come back empty with their capacity", "[reuse]") {
  using hmc::coll::Shelf;
  std::vector<int> v(100, 7);
  const int* storage = v.data();
  Shelf<int>::give(v);
  CHECK(v.empty());
  std::vector<int> w = Shelf<int>::take();
  CHECK(w.empty());
  CHECK(w.capacity() >= 100);
  CHECK(w.data() == storage);

  std::vector<int> huge(1 << 20);
  Shelf<int>::give(huge);  // too large to keep: left with its owner, not shelved
  CHECK(huge.size() == (1u << 20));
  CHECK(Shelf<int>::take().capacity() == 0);
}

TEST_CASE("collective scratch keeps a few large host blocks", "[reuse]") {
  using hmc::coll::ScratchPool;
  auto block = [](std::size_t n) { return static_cast<uint8_t*>(::operator new(n, std::align_val_t{64})); };
  ScratchPool pool;
  std::size_t size = 0;
  CHECK(pool.take_host(1 << 20, size) == nullptr);  // nothing kept yet

  uint8_t* two = block(2 << 20);
  pool.give_host(two, 2 << 20);
  CHECK(pool.take_host(3 << 20, size) == nullptr);  // too small for that
  CHECK(pool.take_host((3 << 20) / 2, size) == two);
  CHECK(size == (2u << 20));
  CHECK(pool.take_host(1 << 20, size) == nullptr);  // taken: no longer kept

  // The smallest that fits; at most kHostKept stay (the rest are freed at once).
  std::vector<uint8_t*> given;
  for (std::size_t i = 0; i < ScratchPool::kHostKept + 2; ++i) {
    const std::size_t n = std::size_t{1} << (20 + i);
    given.push_back(block(n));
    pool.give_host(given.back(), n);
  }
  pool.give_host(two, 2 << 20);  // one more than kept: freed
  uint8_t* got = pool.take_host(3 << 20, size);
  CHECK(got == given[2]);
  CHECK(size == (4u << 20));
  ::operator delete(got, std::align_val_t{64});
  std::size_t left = 0;
  while (uint8_t* p = pool.take_host(1, size)) {
    ++left;
    ::operator delete(p, std::align_val_t{64});
  }
  CHECK(left == ScratchPool::kHostKept - 1);
}
