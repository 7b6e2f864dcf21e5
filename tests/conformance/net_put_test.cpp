// Puts: data at the offset and nowhere else, refusals, the ordering contract,
// and a put from another process.
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include "net_child.h"
#include "net_kit.h"
#include "net_region.h"

using namespace hmc_conformance;

namespace {

// Starts a put; the outcome is the immediate error or the request's.
void* start_put(Session& s, void* conn, const char* src, size_t len,
                const std::vector<uint8_t>& rkey, uint64_t offset, int* rc) {
  void* req = nullptr;
  *rc = s.p->put(s.state, conn, src, len, nullptr, rkey.data(), rkey.size(), offset, &req);
  return *rc < 0 ? nullptr : req;
}

Outcome put_outcome(Session& s, void* conn, const char* src, size_t len,
                    const std::vector<uint8_t>& rkey, uint64_t offset) {
  int rc = 0;
  void* req = start_put(s, conn, src, len, rkey, offset, &rc);
  if (req == nullptr) {
    Outcome o;
    o.rc = rc;
    o.message = "(refused by put itself)";
    return o;
  }
  return s.wait(req);
}

bool skip_without_put(Session& s) {
  if (s.has(HMC_NET_CAP_PUT)) return false;
  WARN(s.p->name << " has no HMC_NET_CAP_PUT: put checks skipped");
  return true;
}

void for_each_put_pair(const std::function<void(Session&, Session&, Link&)>& body) {
  for_each_pair_with(HMC_NET_CAP_PUT, "put", body);
}

}  // namespace

TEST_CASE("net: a put lands at the offset of the registered region and nowhere else",
          "[net][put]") {
  for_each_put_pair([](Session& s, Session& t, Link& link) {
    uint64_t salt = 200;
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      for (bool forward : {true, false}) {
        Session& from = forward ? s : t;
        Session& to = forward ? t : s;
        void* conn = forward ? link.a : link.b;
        INFO((forward ? "connector -> acceptor" : "acceptor -> connector"));
        for (auto [region_len, offset, len] :
             {std::tuple<size_t, uint64_t, size_t>{1 << 20, 4099, 100000},
              {4096, 0, 4096},
              {4096, 4095, 1},
              {4096, 17, 0},
              {16 << 20, 0, 16 << 20}}) {
          INFO("put of " << len << " bytes at " << offset << " into " << region_len);
          Region r(to, region_len, mem, 64);
          const auto data = random_bytes(len, ++salt);
          Outcome o = put_outcome(from, conn, data.data(), data.size(), r.rkey, offset);
          INFO(o.message);
          REQUIRE_FALSE(o.timed_out);
          REQUIRE(o.rc == HMC_PROV_OK);
          CHECK(o.done);
          check_region(r, offset, data);
        }
      }
    }
  });
}

TEST_CASE("net: puts past the end or with a forged key are refused", "[net][put]") {
  for_each_put_pair([](Session& s, Session& t, Link& link) {
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      Region r(t, 1 << 20, mem, 4096);
      // As long as the longest put below: a provider may read its source before the
      // target refuses the put (net.h lets the initiator check early, not must).
      const auto data = random_bytes(r.size(), 300);
      const uint64_t len = r.size();
      auto refused = [&](const std::vector<uint8_t>& rkey, uint64_t offset, size_t n) {
        Outcome o = put_outcome(s, link.a, data.data(), n, rkey, offset);
        INFO("put of " << n << " bytes at offset " << offset << ": rc " << o.rc << " "
                       << o.message);
        CHECK_FALSE(o.timed_out);
        return o.rc;
      };
      CHECK(refused(r.rkey, len - 10, 100) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(refused(r.rkey, len + 1, 1) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(refused(r.rkey, UINT64_MAX - 4, 16) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(refused(r.rkey, 1, len) == HMC_PROV_ERR_OUT_OF_BOUNDS);

      // The key of a deregistered region (its memory still mapped here).
      Region gone(t, 1 << 16, mem);
      const auto stale = gone.rkey;
      gone.dereg();
      CHECK(refused(stale, 0, 64) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      // A zero-length put is checked too: with a notify behind it, it is a doorbell.
      CHECK(refused(stale, 0, 0) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(untouched(gone));

      // Random bytes and a truncated key: refused, as out of bounds or invalid.
      std::vector<uint8_t> forged(r.rkey.size());
      fill_random(reinterpret_cast<char*>(forged.data()), forged.size(), 301);
      int rc = refused(forged, 0, 64);
      CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));
      std::vector<uint8_t> cut(r.rkey.begin(), r.rkey.end() - 1);
      rc = refused(cut, 0, 64);
      CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));
      // Any one byte of the key changed: a put across the end is still refused.
      for (size_t i = 0; i < r.rkey.size(); ++i) {
        INFO("key byte " << i << " changed");
        std::vector<uint8_t> changed = r.rkey;
        changed[i] ^= 0xff;
        CHECK(refused(changed, len - 32, 64) < 0);
      }

      CHECK(untouched(r));
      // The connection still works after the refusals.
      const auto small = random_bytes(1000, 302);
      Outcome o = put_outcome(s, link.a, small.data(), small.size(), r.rkey, 5);
      REQUIRE(o.rc == HMC_PROV_OK);
      check_region(r, 5, small);
    }
  });
}

// Offsets and bounds are 64-bit in the ABI: a provider that keeps them in 32 bits would
// land a put past 4 GiB near the region's start, or take a far offset for a near one.
TEST_CASE("net: puts reach offsets past 4 GiB and stay inside the region", "[net][put][large]") {
  for_each_put_pair([](Session& s, Session& t, Link& link) {
    constexpr uint64_t k4G = uint64_t{1} << 32;
    constexpr size_t kMiB = size_t{1} << 20, kGuard = 4096;
    const size_t len = k4G + kMiB;
    // Strict overcommit (vm.overcommit_memory=2) refuses the mapping: nothing to check then.
    if (void* m = mmap(nullptr, len + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0); m == MAP_FAILED) {
      WARN("no sparse mapping of " << len << " bytes here (" << std::strerror(errno) << "): skipped");
      return;
    } else {
      munmap(m, len + kGuard);
    }
    Region r(t, len, Mem::sparse, kGuard);
    // Poison from 1 MiB below the 4 GiB mark to past the end; the rest reads as zeros.
    const uint64_t lo = k4G - kMiB;
    const size_t watched = len + kGuard - lo;
    std::memset(r.data() + lo, kPoison, watched);
    const auto across = random_bytes(kMiB, 310);  // from 512 KiB below the mark to above it
    const auto past = random_bytes(64 << 10, 311);
    const uint64_t across_at = k4G - kMiB / 2 + 3, past_at = across_at + kMiB + 4096;
    for (auto [data, offset] : {std::pair{&across, across_at}, std::pair{&past, past_at}}) {
      INFO("put of " << data->size() << " bytes at " << offset);
      Outcome o = put_outcome(s, link.a, data->data(), data->size(), r.rkey, offset);
      INFO(o.message);
      REQUIRE_FALSE(o.timed_out);
      REQUIRE(o.rc == HMC_PROV_OK);
      CHECK(first_diff(r.data() + offset, data->data(), data->size()) == data->size());
    }
    // Poison everywhere else in the watched window, zeros where a cut offset would land.
    CHECK(first_not(r.data() + lo, across_at - lo, kPoison) == across_at - lo);
    const uint64_t gap = across_at + kMiB;
    CHECK(first_not(r.data() + gap, past_at - gap, kPoison) == past_at - gap);
    const uint64_t tail = past_at + past.size();
    CHECK(first_not(r.data() + tail, len + kGuard - tail, kPoison) == len + kGuard - tail);
    CHECK(first_not(r.data(), 2 * kMiB, 0) == 2 * kMiB);
    for (auto [offset, n] : {std::pair<uint64_t, size_t>{len - 10, 100}, {2 * k4G + 16, 64}, {len, 1}}) {
      Outcome o = put_outcome(s, link.a, past.data(), n, r.rkey, offset);
      INFO("put of " << n << " bytes at offset " << offset << ": rc " << o.rc << " " << o.message);
      CHECK_FALSE(o.timed_out);
      CHECK(o.rc == HMC_PROV_ERR_OUT_OF_BOUNDS);
    }
    CHECK(first_not(r.data() + len, kGuard, kPoison) == kGuard);
    CHECK(first_not(r.data(), 2 * kMiB, 0) == 2 * kMiB);
  });
}

// A key the initiator already used, its region deregistered just before a large put: the
// revocation may still be on its way, and the put must not land in memory the owner took
// back. Memory from mem_alloc is the exception: a provider may let peers map it and write
// it themselves (ucx over shared memory), and then a put already decided can land; it must
// land whole (docs/provider-guide.md).
TEST_CASE("net: a put racing the target's deregistration does not land", "[net][put][revoked]") {
  for_each_put_pair([](Session& s, Session& t, Link& link) {
    const auto big = random_bytes(4 << 20, 303);
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      for (int round = 0; round < 3; ++round) {
        Region used(t, big.size(), mem);
        REQUIRE(put_outcome(s, link.a, big.data(), 64, used.rkey, 0).rc == HMC_PROV_OK);
        used.poison();
        used.dereg();
        Outcome o = put_outcome(s, link.a, big.data(), big.size(), used.rkey, 0);
        INFO("round " << round << ": rc " << o.rc << " " << o.message);
        REQUIRE_FALSE(o.timed_out);
        if (mem == Mem::provider && o.rc == HMC_PROV_OK) {
          CHECK(first_diff(used.data(), big.data(), big.size()) == big.size());
        } else {
          CHECK(o.rc == HMC_PROV_ERR_OUT_OF_BOUNDS);
          CHECK(untouched(used));
        }
      }
    }
  });
}

// dereg_mem's promise (net.h): once it returns, nothing of any put lands in the region, so
// its memory may be freed and used again. The initiator keeps two 16 MiB puts in flight
// while the target deregisters, then writes the memory as its next owner would and watches
// it. shm before put_fence.h: a put whose key check had passed went on copying, up to 4 MiB
// of it after the deregistration returned.
TEST_CASE("net: no byte of a put lands after the target's deregistration returned",
          "[net][put][revoked]") {
  for_each_put_pair([](Session& s, Session& t, Link& link) {
    constexpr size_t kLen = 16 << 20;
    constexpr char kReused = 0x5a;
    const auto src = random_bytes(kLen, 505);
    for (Mem mem : {Mem::heap, Mem::shared}) {
      for (int round = 0; round < 6; ++round) {
        INFO(mem_name(mem) << ", round " << round);
        Region r(t, kLen, mem);
        std::atomic<int> landed{0};
        std::atomic<bool> stop{false};
        std::atomic<bool> failed{false};  // `last` is the putter's until join
        Outcome last;
        last.rc = HMC_PROV_OK;
        std::thread putter([&] {
          std::deque<void*> in_flight;
          bool going = true;
          for (;;) {
            while (going && !stop.load() && in_flight.size() < 2) {
              int rc = 0;
              void* req = start_put(s, link.a, src.data(), kLen, r.rkey, 0, &rc);
              if (req == nullptr) {
                last.rc = rc;
                going = false;
                failed = true;
              } else {
                in_flight.push_back(req);
              }
            }
            if (in_flight.empty()) return;
            Outcome o = s.wait(in_flight.front());
            in_flight.pop_front();
            if (o.rc == HMC_PROV_OK && !o.timed_out) {
              ++landed;
            } else if (going) {
              last = o;
              going = false;
              failed = true;
            }
          }
        });
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (landed.load() < 2 + round % 3 && !failed.load() &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        r.dereg();
        std::memset(r.data(), kReused, kLen);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const size_t kept = first_not(r.data(), kLen, kReused);
        stop = true;
        putter.join();
        INFO("puts done " << landed.load() << "; last rc " << last.rc << " " << last.message);
        REQUIRE(landed.load() >= 2);
        CHECK_FALSE(last.timed_out);
        CHECK((last.rc == HMC_PROV_OK || last.rc == HMC_PROV_ERR_OUT_OF_BOUNDS));
        CHECK(kept == kLen);
      }
    }
  });
}

// A peer that goes away closes its connections before it releases its regions (the core's
// abort and finalize do): a put arriving between the two must fail as the peer lost, not
// as a stale key, or a collective's survivor reports a refused put where a rank died
// (test_collectives.cpp, "a lost peer fails the collective on the survivors"). The put
// shows the difference only where it runs before the initiator has read the close: with
// shm that was 3 of 400 tries in one run on the 2-vCPU VM and none in three others, so
// this catches a regression there only now and then; the rounds raise the odds. Tagged
// [revoked] as the case above: a provider forced to write where UCX is told
// (HMC_UCX_PUT=rma) may land such a put, and those runs leave both out.
TEST_CASE("net: a put into a region released after its owner closed the connection fails as peer lost",
          "[net][put][peer][revoked]") {
  for_each_put_pair([](Session& s, Session& t, Link&) {
    const auto data = random_bytes(1 << 20, 404);
    for (int round = 0; round < 200; ++round) {
      for (Mem mem : {Mem::heap, Mem::shared}) {
        INFO("round " << round << ", " << mem_name(mem));
        Link link = connect_pair(s, t);
        Region r(t, data.size(), mem);
        REQUIRE(put_outcome(s, link.a, data.data(), 64, r.rkey, 0).rc == HMC_PROV_OK);
        r.poison();
        REQUIRE(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
        r.dereg();
        Outcome o = put_outcome(s, link.a, data.data(), data.size(), r.rkey, 0);
        INFO("rc " << o.rc << " " << o.message);
        REQUIRE_FALSE(o.timed_out);
        REQUIRE(o.rc == HMC_PROV_ERR_PEER_LOST);
        REQUIRE(untouched(r));
        REQUIRE(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
      }
    }
  });
}

TEST_CASE("net: a message sent after a put arrives after the put's data", "[net][put][order]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      Region r(t, 4 << 20, mem);
      for (uint32_t i = 0; i < 20; ++i) {
        INFO("round " << i);
        const auto data = random_bytes(r.size() - i, 400 + i);
        uint32_t got = ~0u;
        void* rreq = nullptr;
        REQUIRE(t.p->recv_msg(t.state, link.b, &got, sizeof(got), &rreq) >= 0);
        int rc = 0;
        void* preq = start_put(s, link.a, data.data(), data.size(), r.rkey, i, &rc);
        REQUIRE(preq != nullptr);
        void* sreq = nullptr;
        REQUIRE(s.p->send_msg(s.state, link.a, &i, sizeof(i), &sreq) >= 0);
        Outcome o = t.wait(rreq);  // the put's own request is not looked at before this
        REQUIRE(o.rc == HMC_PROV_OK);
        CHECK(got == i);
        CHECK(first_diff(r.data() + i, data.data(), data.size()) == data.size());
        CHECK(s.wait(preq).rc == HMC_PROV_OK);
        CHECK(s.wait(sreq).rc == HMC_PROV_OK);
      }
    }
  });
}

// Messages one way while the peer's puts come the other, over one connection: the
// acknowledgements of those puts go out between this side's messages. With small socket
// buffers a message written from the caller's thread is taken only in part, and the
// rest must follow before any other frame; tcp used to put a queued acknowledgement
// first, in the middle of the message (its receiver then got the frame's header as
// payload, then lost the connection).
TEST_CASE("net: messages one way and puts the other on one connection arrive whole", "[net][put][order]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    Config small = env_config();
    small["HMC_TCP_SOCKBUF"] = "4K";  // read by tcp alone: its writes are then partial
    Session a, b;
    REQUIRE(a.open(s.path, small));
    REQUIRE(b.open(s.path, small));
    Link link = connect_pair(a, b);  // a sends messages, b puts into a
    constexpr size_t kPut = 1 << 10;
    constexpr int kInFlight = 4;
    Region r(a, kInFlight * kPut, Mem::heap);
    const auto puts = random_bytes(kInFlight * kPut, 710);
    std::atomic<bool> stop{false};
    std::atomic<int> put_failures{0};
    std::string put_failure;
    std::thread putter([&] {  // keeps puts in flight while the messages go the other way
      while (!stop.load() && put_failures.load() == 0) {
        std::vector<void*> reqs;
        for (int k = 0; k < kInFlight; ++k) {
          int rc = 0;
          reqs.push_back(start_put(b, link.b, puts.data() + k * kPut, kPut, r.rkey, k * kPut, &rc));
        }
        for (void* req : reqs) {
          Outcome o = req ? b.wait(req) : Outcome{};
          if (o.rc != HMC_PROV_OK && put_failures.fetch_add(1) == 0) put_failure = o.message;
        }
      }
    });
    struct Joiner {  // a failed REQUIRE below must not leave the thread running
      std::atomic<bool>& stop;
      std::thread& t;
      ~Joiner() {
        stop = true;
        if (t.joinable()) t.join();
      }
    } joiner{stop, putter};
    constexpr size_t kMsg = 60 << 10;
    for (int i = 0; i < 300 && put_failures.load() == 0; ++i) {
      INFO("message " << i);
      const auto msg = random_bytes(kMsg, 720 + i);
      Recv got;
      post_recv(b, link.b, got, kMsg);
      Outcome sent = a.wait(post_send(a, link.a, msg));
      INFO(sent.message);
      REQUIRE(sent.rc == HMC_PROV_OK);
      check_recv(b, got, msg);
      std::this_thread::sleep_for(std::chrono::microseconds(30));  // the next send finds the writer idle
    }
    stop = true;
    putter.join();
    INFO(put_failure);
    CHECK(put_failures.load() == 0);
    CHECK(first_diff(r.data(), puts.data(), puts.size()) == puts.size());
  });
}

namespace {

void send_to_child(Session& s, void* conn, const void* buf, size_t len) {
  void* req = nullptr;
  REQUIRE(s.p->send_msg(s.state, conn, buf, len, &req) >= 0);
  CHECK(s.wait(req).rc == HMC_PROV_OK);
}

// Receives exactly sizeof(T) from the child.
template <class T>
T recv_from_child(Session& s, void* conn) {
  T out{};
  void* req = nullptr;
  REQUIRE(s.p->recv_msg(s.state, conn, &out, sizeof(out), &req) >= 0);
  Outcome o = s.wait(req);
  INFO(o.message);
  REQUIRE(o.rc == HMC_PROV_OK);
  REQUIRE(o.bytes == sizeof(T));
  return out;
}

std::vector<uint8_t> plan_other_rkey(const PutPlan& plan) {
  return {plan.other_rkey, plan.other_rkey + plan.other_rkey_len};
}

}  // namespace

// One child per kind of memory: for shm, heap memory is written with
// process_vm_writev, shared memory through a mapping of the file, and shared
// memory whose fd names another file falls back to process_vm_writev.
TEST_CASE("net: a put from another process lands before its next message", "[net][put][process]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared, Mem::shared_fd_reused})) {
      INFO(mem_name(mem));
      const Link local = listen_local(s);
      void* listener = local.listener;
      Child child({"put", s.path, local.addr, std::to_string(seed())});
      void* conn = s.accept(listener, nullptr);
      REQUIRE(conn != nullptr);

      Region r(s, 16 << 20, mem, 4096);
      Region other(s, 4 * kOtherLen, mem, 64);
      PutPlan plan{};
      plan.offset = 12345;
      plan.len = r.size() - plan.offset - 100;
      plan.region_len = r.size();
      plan.rkey_len = static_cast<uint32_t>(r.rkey.size());
      std::memcpy(plan.rkey, r.rkey.data(), r.rkey.size());
      plan.other_rkey_len = static_cast<uint32_t>(other.rkey.size());
      std::memcpy(plan.other_rkey, other.rkey.data(), other.rkey.size());

      uint32_t marker = 0;
      void* mreq = nullptr;
      REQUIRE(s.p->recv_msg(s.state, conn, &marker, sizeof(marker), &mreq) >= 0);
      send_to_child(s, conn, &plan, sizeof(plan));
      Outcome o = s.wait(mreq);
      INFO(o.message);
      REQUIRE(o.rc == HMC_PROV_OK);
      REQUIRE(marker == kMarker);
      // Checked when the marker arrived: the data is already there.
      const auto data = random_bytes(plan.len, kPutSalt);
      check_region(r, plan.offset, data);

      auto report = recv_from_child<PutReport>(s, conn);
      CHECK(report.put_rc == HMC_PROV_OK);
      CHECK(report.other_rc == HMC_PROV_OK);
      check_region(other, 0, random_bytes(kOtherLen, kOtherSalt));

      // The same memory registered anew: the child's key for it is stale now,
      // whatever the provider kept from using it.
      other.dereg();
      other.poison();
      other.reg();
      REQUIRE(other.rkey != plan_other_rkey(plan));
      send_to_child(s, conn, "go", 3);
      auto stale = recv_from_child<StaleReport>(s, conn);
      CHECK(stale.stale_rc == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(stale.changed_tried == r.rkey.size());
      INFO("first accepted change: key byte " << stale.first_accepted);
      CHECK(stale.changed_accepted == 0);
      CHECK(untouched(other));
      check_region(r, plan.offset, data);

      send_to_child(s, conn, "bye", 4);
      int status = child.wait_exit(timeout());
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
      CHECK(s.p->close_listener(s.state, listener) == HMC_PROV_OK);
    }
  });
}

// A peer that shrinks (ftruncate) the shared file its region lies in, after a first put
// into it, through a bug or on purpose. Its next put must fail, and the initiator must live:
// had it mapped the file to write with memcpy, it would die of SIGBUS (sealed files only,
// common/sealed_file.h). The owner may die instead where it writes the data itself into
// the mapping it shrank (tcp).
TEST_CASE("net: a put into a shared file its owner shrank fails, and the initiator lives", "[net][put][process][shrink]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    const Link local = listen_local(s);
    Child child({"shrink", s.path, local.addr, std::to_string(seed())});
    void* conn = s.accept(local.listener, nullptr);
    REQUIRE(conn != nullptr);
    const auto key = recv_from_child<ShrinkKey>(s, conn);
    REQUIRE(key.rkey_len <= HMC_NET_RKEY_MAX);
    const std::vector<uint8_t> rkey(key.rkey, key.rkey + key.rkey_len);
    const auto data = random_bytes(kShrinkPut, kShrinkSalt);
    Outcome first = put_outcome(s, conn, data.data(), data.size(), rkey, 0);
    INFO("first put: rc " << first.rc << " " << first.message);
    REQUIRE(first.rc == HMC_PROV_OK);
    send_to_child(s, conn, &kMarker, sizeof(kMarker));
    REQUIRE(recv_from_child<uint32_t>(s, conn) == kMarker);  // the file is empty now
    Outcome o = put_outcome(s, conn, data.data(), data.size(), rkey, 0);
    INFO("put after the shrink: rc " << o.rc << " " << o.message);
    CHECK_FALSE(o.timed_out);
    CHECK(o.rc != HMC_PROV_OK);
    void* req = nullptr;
    if (s.p->send_msg(s.state, conn, "bye", 4, &req) >= 0) (void)s.wait(req);
    const int status = child.wait_exit(timeout());
    INFO("child status " << status);
    // The child may die where it writes into the file it shrank (of SIGBUS, or as a
    // sanitizer ends a process on it): only that it ended is checked.
    CHECK(status != -1);
    CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, local.listener) == HMC_PROV_OK);
  });
}

// HMC_NET_CAP_MEM_ALLOC: memory from mem_alloc comes registered (its mr packs a
// key and serves as a put source), ranges inside it register without a new
// registration of their own, and mem_free refuses what mem_alloc did not make.
TEST_CASE("net: memory from mem_alloc comes registered", "[net][put][mem_alloc]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MEM_ALLOC)) {
      WARN(s.p->name << " has no HMC_NET_CAP_MEM_ALLOC: mem_alloc checks skipped");
      return;
    }
    REQUIRE(s.p->struct_size >= sizeof(hmc_net_provider_t));  // the table test checks the rest
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    constexpr size_t kLen = (4 << 20) + 123;
    void* ptr = nullptr;
    void* mr = nullptr;
    REQUIRE(t.p->mem_alloc(t.state, kLen, &ptr, &mr) == HMC_PROV_OK);
    REQUIRE(ptr != nullptr);
    auto* base = static_cast<char*>(ptr);
    std::memset(base, kPoison, kLen);
    std::vector<uint8_t> whole(HMC_NET_RKEY_MAX);
    size_t key_len = 0;
    REQUIRE(t.p->pack_rkey(t.state, mr, whole.data(), whole.size(), &key_len) == HMC_PROV_OK);
    REQUIRE(key_len > 0);
    whole.resize(key_len);

    // Into the whole allocation, up to its last byte; one byte more is refused.
    const auto tail = random_bytes(1 << 20, 500);
    Outcome o = put_outcome(s, link.a, tail.data(), tail.size(), whole, kLen - tail.size());
    INFO(o.message);
    REQUIRE(o.rc == HMC_PROV_OK);
    CHECK(first_diff(base + kLen - tail.size(), tail.data(), tail.size()) == tail.size());
    CHECK(first_not(base, kLen - tail.size(), kPoison) == kLen - tail.size());
    CHECK(put_outcome(s, link.a, tail.data(), 2, whole, kLen - 1).rc == HMC_PROV_ERR_OUT_OF_BOUNDS);

    // A range inside it: the key bounds the range, not the allocation.
    constexpr size_t kOff = 8192 + 7, kSub = 100000;
    void* sub = nullptr;
    REQUIRE(t.p->reg_mem(t.state, base + kOff, kSub, HMC_MEM_HOST, &sub) == HMC_PROV_OK);
    std::vector<uint8_t> sub_key(HMC_NET_RKEY_MAX);
    REQUIRE(t.p->pack_rkey(t.state, sub, sub_key.data(), sub_key.size(), &key_len) == HMC_PROV_OK);
    sub_key.resize(key_len);
    const auto mid = random_bytes(kSub - 10, 501);
    o = put_outcome(s, link.a, mid.data(), mid.size(), sub_key, 10);
    INFO(o.message);
    REQUIRE(o.rc == HMC_PROV_OK);
    CHECK(first_diff(base + kOff + 10, mid.data(), mid.size()) == mid.size());
    CHECK(first_not(base, kOff + 10, kPoison) == kOff + 10);
    CHECK(put_outcome(s, link.a, mid.data(), 11, sub_key, kSub - 10).rc == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(first_not(base + kOff + kSub, 1000, kPoison) == 1000);

    // As a put source: the other way, into heap memory of s.
    Region heap(s, 1 << 20, Mem::heap, 64);
    o = put_outcome(t, link.b, base + kOff + 10, mid.size(), heap.rkey, 3);
    REQUIRE(o.rc == HMC_PROV_OK);
    check_region(heap, 3, mid);

    // mem_free refuses a pointer mem_alloc did not return; the range outlives the free.
    CHECK(t.p->mem_free(t.state, base + 1, mr) < 0);
    CHECK(t.p->mem_free(t.state, ptr, mr) == HMC_PROV_OK);
    CHECK(t.p->dereg_mem(t.state, sub) == HMC_PROV_OK);
  });
}
