// Messages: sizes, order, both directions, truncation, close_conn, several
// sending threads.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "net_kit.h"

using namespace hmc_conformance;

TEST_CASE("net: messages arrive whole and in order, both ways, posted early or late",
          "[net][msg]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) {
      WARN(s.p->name << " has no HMC_NET_CAP_MSG: message checks skipped");
      return;
    }
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    hmc_net_props_t props{};
    props.struct_size = sizeof(props);
    REQUIRE(s.p->props(s.state, &props) == HMC_PROV_OK);

    struct End {
      Session& from;
      void* from_conn;
      Session& to;
      void* to_conn;
    };
    const End ends[] = {{s, link.a, t, link.b}, {t, link.b, s, link.a}};
    uint64_t salt = 100;
    for (size_t size : {size_t{0}, size_t{1}, size_t{64} << 10, size_t{16} << 20}) {
      if (size > props.max_msg_size) continue;
      for (const End& e : ends) {
        INFO("message of " << size << " bytes");
        const auto data = random_bytes(size, ++salt);
        // Receive posted first: lands straight in the buffer.
        Recv r;
        post_recv(e.to, e.to_conn, r, size + 100);
        void* sreq = post_send(e.from, e.from_conn, data);
        check_recv(e.to, r, data);
        check_sent(e.from, sreq, size);
        // Sent first: the provider holds it until a receive is posted.
        sreq = post_send(e.from, e.from_conn, data);
        s.nap(std::chrono::milliseconds(50));
        Recv late;
        post_recv(e.to, e.to_conn, late, size);
        check_recv(e.to, late, data);
        check_sent(e.from, sreq, size);
      }
    }

    // A burst each way at once: receives complete in posting order.
    std::mt19937_64 rng(seed());
    std::vector<std::vector<char>> ab, ba;
    for (int i = 0; i < 30; ++i) {
      ab.push_back(random_bytes(rng() % (200 << 10), ++salt));
      ba.push_back(random_bytes(rng() % (200 << 10), ++salt));
    }
    std::vector<Recv> rb(30), ra(30);
    std::vector<void*> sab, sba;
    for (int i = 0; i < 15; ++i) {
      post_recv(t, link.b, rb[i], 200 << 10);
      post_recv(s, link.a, ra[i], 200 << 10);
    }
    for (int i = 0; i < 30; ++i) {
      sab.push_back(post_send(s, link.a, ab[i]));
      sba.push_back(post_send(t, link.b, ba[i]));
    }
    for (int i = 15; i < 30; ++i) {
      post_recv(t, link.b, rb[i], 200 << 10);
      post_recv(s, link.a, ra[i], 200 << 10);
    }
    for (int i = 0; i < 30; ++i) {
      INFO("burst message " << i);
      check_recv(t, rb[i], ab[i]);
      check_recv(s, ra[i], ba[i]);
      check_sent(s, sab[i], ab[i].size());
      check_sent(t, sba[i], ba[i].size());
    }
  });
}

// Transports switch protocol at small sizes (UCX's shared memory copies up to 100 bytes,
// headers included, inline): every size across such a switch must arrive whole.
TEST_CASE("net: messages of every size up to 256 bytes arrive whole, both ways", "[net][msg]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;  // the first case says so
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    uint64_t salt = 300;
    for (size_t size = 0; size <= 256; ++size) {
      INFO("message of " << size << " bytes");
      const auto ab = random_bytes(size, ++salt), ba = random_bytes(size, ++salt);
      Recv rb, ra;
      post_recv(t, link.b, rb, 256);
      post_recv(s, link.a, ra, 256);
      void* sab = post_send(s, link.a, ab);
      void* sba = post_send(t, link.b, ba);
      check_recv(t, rb, ab);
      check_recv(s, ra, ba);
      check_sent(s, sab, size);
      check_sent(t, sba, size);
    }
  });
}

TEST_CASE("net: a message larger than the posted buffer fails that receive with TRUNCATED",
          "[net][msg]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    for (bool posted_first : {true, false}) {
      INFO((posted_first ? "receive posted first" : "message sent first"));
      const auto big = random_bytes(1000, 7);
      Recv r;
      void* sreq = nullptr;
      if (posted_first) post_recv(t, link.b, r, 999);
      sreq = post_send(s, link.a, big);
      if (!posted_first) {
        s.nap(std::chrono::milliseconds(50));
        post_recv(t, link.b, r, 999);
      }
      Outcome o = t.wait(r.req);
      REQUIRE_FALSE(o.timed_out);
      CHECK(o.rc == HMC_PROV_ERR_TRUNCATED);
      CHECK_FALSE(o.message.empty());
      CHECK_FALSE(s.wait(sreq).timed_out);
      // The connection carries on.
      const auto next = random_bytes(10, 8);
      Recv ok;
      post_recv(t, link.b, ok, 100);
      void* nreq = post_send(s, link.a, next);
      check_recv(t, ok, next);
      check_sent(s, nreq, next.size());
    }
  });
}

TEST_CASE("net: close_conn fails pending requests; the peer sees the loss", "[net][close]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    {
      Link link = connect_pair(s, t);
      std::vector<Recv> mine(3);
      for (auto& r : mine) post_recv(s, link.a, r, 100);
      Recv theirs;
      post_recv(t, link.b, theirs, 100);
      REQUIRE(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
      for (auto& r : mine) {
        Outcome o = s.wait(r.req);
        REQUIRE_FALSE(o.timed_out);
        CHECK(o.rc == HMC_PROV_ERR_CLOSED);
        CHECK(first_not(r.buf.data(), r.buf.size(), kPoison) == r.buf.size());
      }
      Outcome o = t.wait(theirs.req);
      INFO("peer's pending receive: " << o.message);
      REQUIRE_FALSE(o.timed_out);
      CHECK(o.rc == HMC_PROV_ERR_PEER_LOST);
      CHECK_FALSE(o.message.empty());
      // Later calls on the lost connection fail too (at once or through the request).
      void* req = nullptr;
      int rc = t.p->send_msg(t.state, link.b, "x", 1, &req);
      if (rc >= 0) rc = t.wait(req).rc;
      CHECK(rc < 0);
      CHECK(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
      CHECK(t.p->close_listener(t.state, link.listener) == HMC_PROV_OK);
    }
    {
      // close_conn in the middle of a large transfer: no hang, no crash; each side
      // either completed (with the right data) or failed.
      Link link = connect_pair(s, t);
      const auto data = random_bytes(64 << 20, 9);
      Recv r;
      post_recv(t, link.b, r, data.size());
      void* sreq = post_send(s, link.a, data);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      REQUIRE(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
      Outcome so = s.wait(sreq);
      REQUIRE_FALSE(so.timed_out);
      CHECK((so.rc == HMC_PROV_OK || so.rc == HMC_PROV_ERR_CLOSED));
      Outcome ro = t.wait(r.req);
      REQUIRE_FALSE(ro.timed_out);
      if (ro.rc == HMC_PROV_OK) {
        CHECK(first_diff(r.buf.data(), data.data(), data.size()) == data.size());
      } else {
        CHECK(ro.rc == HMC_PROV_ERR_PEER_LOST);
      }
      CHECK(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
    }
  });
}

namespace {

// A message of the multi-thread test: who sent it, its number, then bytes
// that follow from both.
struct Tagged {
  uint32_t thread;
  uint32_t seq;
};

std::vector<char> tagged_message(uint32_t thread, uint32_t seq, size_t len) {
  std::vector<char> m = random_bytes(len, 1000 + thread * 100000ull + seq);
  const Tagged tag{thread, seq};
  std::memcpy(m.data(), &tag, sizeof(tag));
  return m;
}

}  // namespace

TEST_CASE("net: messages sent from several threads at once arrive whole, each thread's in order",
          "[net][msg][threads]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    constexpr uint32_t kThreads = 4;
    constexpr uint32_t kPerThread = 150;
    constexpr size_t kMaxLen = 96 << 10;  // small ones and ones past any inline limit
    // Sizes and pauses are drawn here: Catch is not used on the sender threads.
    std::mt19937_64 rng(seed() + 77);
    std::vector<std::vector<size_t>> sizes(kThreads);
    std::vector<std::vector<int>> pauses(kThreads);  // microseconds before each send
    for (uint32_t th = 0; th < kThreads; ++th) {
      for (uint32_t i = 0; i < kPerThread; ++i) {
        sizes[th].push_back(sizeof(Tagged) + rng() % (rng() % 2 ? 256 : kMaxLen));
        pauses[th].push_back(rng() % 4 == 0 ? static_cast<int>(rng() % 100) : 0);
      }
    }
    std::atomic<int> send_failures{0};
    std::vector<std::thread> senders;
    for (uint32_t th = 0; th < kThreads; ++th) {
      senders.emplace_back([&, th] {
        std::vector<std::vector<char>> msgs;
        std::vector<void*> reqs;
        for (uint32_t i = 0; i < kPerThread; ++i)
          msgs.push_back(tagged_message(th, i, sizes[th][i]));
        for (uint32_t i = 0; i < kPerThread; ++i) {
          if (pauses[th][i] > 0)
            std::this_thread::sleep_for(std::chrono::microseconds(pauses[th][i]));
          void* req = nullptr;
          if (s.p->send_msg(s.state, link.a, msgs[i].data(), msgs[i].size(), &req) < 0) {
            ++send_failures;
            continue;
          }
          if (i % 3 == 0) {  // sometimes wait at once: the writer is idle more often
            if (s.wait(req).rc != HMC_PROV_OK) ++send_failures;
          } else {
            reqs.push_back(req);
          }
        }
        for (void* req : reqs) {
          if (s.wait(req).rc != HMC_PROV_OK) ++send_failures;
        }
      });
    }
    std::vector<uint32_t> next(kThreads, 0);
    std::vector<char> buf(kMaxLen + 64);
    for (uint32_t n = 0; n < kThreads * kPerThread; ++n) {
      void* req = nullptr;
      REQUIRE(t.p->recv_msg(t.state, link.b, buf.data(), buf.size(), &req) >= 0);
      Outcome o = t.wait(req);
      INFO("message " << n << ": " << o.message);
      REQUIRE(o.rc == HMC_PROV_OK);
      REQUIRE(o.bytes >= sizeof(Tagged));
      Tagged tag{};
      std::memcpy(&tag, buf.data(), sizeof(tag));
      REQUIRE(tag.thread < kThreads);
      INFO("thread " << tag.thread << " message " << tag.seq);
      REQUIRE(tag.seq == next[tag.thread]);
      REQUIRE(o.bytes == sizes[tag.thread][tag.seq]);
      const auto want = tagged_message(tag.thread, tag.seq, o.bytes);
      REQUIRE(first_diff(buf.data(), want.data(), want.size()) == want.size());
      ++next[tag.thread];
    }
    for (auto& th : senders) th.join();
    CHECK(send_failures == 0);
  });
}

TEST_CASE("net: close_conn while other threads send: every request ends, no hang",
          "[net][close][threads]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    constexpr int kThreads = 3;
    std::atomic<bool> closed{false};
    std::atomic<int> bad{0};   // a request that timed out or failed with another code
    std::atomic<int> sent{0};  // requests that completed
    // A provider whose sends go on succeeding after close_conn would keep the senders
    // going: each gives up (and counts as bad) a timeout after the close.
    std::atomic<Clock::rep> closed_at{0};
    auto too_late = [&] {
      return closed.load() && Clock::now().time_since_epoch().count() - closed_at.load() >
                                  std::chrono::duration_cast<Clock::duration>(timeout()).count();
    };
    std::vector<std::thread> senders;
    for (int th = 0; th < kThreads; ++th) {
      senders.emplace_back([&, th] {
        const auto msg = random_bytes(th == 0 ? 100 : (th == 1 ? 4000 : 200000), 50 + th);
        while (true) {
          if (too_late()) {
            ++bad;
            return;
          }
          void* req = nullptr;
          int rc = s.p->send_msg(s.state, link.a, msg.data(), msg.size(), &req);
          if (rc < 0) {
            // `closed` is set before close_conn: a refusal before it is wrong, and one
            // after it must say CLOSED.
            if (!closed.load() || rc != HMC_PROV_ERR_CLOSED) ++bad;
            return;
          }
          Outcome o = s.wait(req);
          if (o.rc == HMC_PROV_OK) {
            ++sent;
          } else {
            if (o.timed_out || o.rc != HMC_PROV_ERR_CLOSED) ++bad;
            return;
          }
        }
      });
    }
    // The peer drains, so the senders keep going until the close.
    std::atomic<bool> stop{false};
    std::thread drain([&] {
      std::vector<char> buf(200000);
      while (!stop.load()) {
        void* req = nullptr;
        if (t.p->recv_msg(t.state, link.b, buf.data(), buf.size(), &req) < 0) return;
        if (t.wait(req, std::chrono::milliseconds(2000)).rc != HMC_PROV_OK) return;
      }
    });
    // Close once sends are flowing (on a loaded host the threads may take a while to start).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto until = Clock::now() + std::chrono::seconds(5); sent.load() == 0 && Clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    closed_at = Clock::now().time_since_epoch().count();
    closed = true;
    REQUIRE(s.p->close_conn(s.state, link.a) == HMC_PROV_OK);
    for (auto& th : senders) th.join();
    stop = true;
    drain.join();
    CHECK(bad == 0);
    CHECK(sent > 0);
    CHECK(t.p->close_conn(t.state, link.b) == HMC_PROV_OK);
  });
}
