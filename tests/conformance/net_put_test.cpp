// Puts: data at the offset and nowhere else, refusals, the ordering contract,
// and a put from another process.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "net_child.h"
#include "net_kit.h"

using namespace hmc_conformance;

namespace {

// A registered, poisoned region of `t` with its packed remote key.
struct Region {
  Session* owner = nullptr;
  std::vector<char> mem;
  void* mr = nullptr;
  std::vector<uint8_t> rkey;

  Region(Session& s, size_t len) : owner(&s), mem(len, static_cast<char>(kPoison)) {
    REQUIRE(s.p->reg_mem(s.state, mem.data(), mem.size(), HMC_MEM_HOST, &mr) == HMC_PROV_OK);
    REQUIRE(mr != nullptr);
    rkey.resize(HMC_NET_RKEY_MAX);
    size_t len_out = 0;
    REQUIRE(s.p->pack_rkey(s.state, mr, rkey.data(), rkey.size(), &len_out) == HMC_PROV_OK);
    REQUIRE(len_out > 0);
    REQUIRE(len_out <= HMC_NET_RKEY_MAX);
    rkey.resize(len_out);
  }
  ~Region() { dereg(); }
  void dereg() {
    if (mr != nullptr) CHECK(owner->p->dereg_mem(owner->state, mr) == HMC_PROV_OK);
    mr = nullptr;
  }
};

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

// The region holds `data` at `offset` and poison everywhere else.
void check_region(const Region& r, uint64_t offset, const std::vector<char>& data) {
  CHECK(first_not(r.mem.data(), offset, kPoison) == offset);
  CHECK(first_diff(r.mem.data() + offset, data.data(), data.size()) == data.size());
  const size_t end = offset + data.size();
  CHECK(first_not(r.mem.data() + end, r.mem.size() - end, kPoison) == r.mem.size() - end);
}

bool skip_without_put(Session& s) {
  if (s.has(HMC_NET_CAP_PUT)) return false;
  WARN(s.p->name << " has no HMC_NET_CAP_PUT: put checks skipped");
  return true;
}

}  // namespace

TEST_CASE("net: a put lands at the offset of the registered region and nowhere else",
          "[net][put]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    uint64_t salt = 200;
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
        Region r(to, region_len);
        const auto data = random_bytes(len, ++salt);
        Outcome o = put_outcome(from, conn, data.data(), data.size(), r.rkey, offset);
        INFO(o.message);
        REQUIRE_FALSE(o.timed_out);
        REQUIRE(o.rc == HMC_PROV_OK);
        CHECK(o.done);
        check_region(r, offset, data);
      }
    }
  });
}

TEST_CASE("net: puts past the end or with a forged key are refused", "[net][put]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    Region r(t, 1 << 20);
    const auto data = random_bytes(1 << 16, 300);
    const uint64_t len = r.mem.size();
    auto refused = [&](const std::vector<uint8_t>& rkey, uint64_t offset, size_t n) {
      Outcome o = put_outcome(s, link.a, data.data(), n, rkey, offset);
      INFO("put of " << n << " bytes at offset " << offset << ": rc " << o.rc << " " << o.message);
      CHECK_FALSE(o.timed_out);
      return o.rc;
    };
    CHECK(refused(r.rkey, len - 10, 100) == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(refused(r.rkey, len + 1, 1) == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(refused(r.rkey, UINT64_MAX - 4, 16) == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(refused(r.rkey, 1, len) == HMC_PROV_ERR_OUT_OF_BOUNDS);

    // The key of a deregistered region (its memory still mapped here).
    Region gone(t, 1 << 16);
    const auto stale = gone.rkey;
    gone.dereg();
    CHECK(refused(stale, 0, 64) == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(first_not(gone.mem.data(), gone.mem.size(), kPoison) == gone.mem.size());

    // Random bytes and a truncated key: refused, as out of bounds or invalid.
    std::vector<uint8_t> forged(r.rkey.size());
    fill_random(reinterpret_cast<char*>(forged.data()), forged.size(), 301);
    int rc = refused(forged, 0, 64);
    CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));
    std::vector<uint8_t> cut(r.rkey.begin(), r.rkey.end() - 1);
    rc = refused(cut, 0, 64);
    CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));

    CHECK(first_not(r.mem.data(), r.mem.size(), kPoison) == r.mem.size());
    // The connection still works after the refusals.
    const auto small = random_bytes(1000, 302);
    Outcome o = put_outcome(s, link.a, small.data(), small.size(), r.rkey, 5);
    REQUIRE(o.rc == HMC_PROV_OK);
    check_region(r, 5, small);
  });
}

TEST_CASE("net: a message sent after a put arrives after the put's data", "[net][put][order]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    Region r(t, 4 << 20);
    for (uint32_t i = 0; i < 20; ++i) {
      INFO("round " << i);
      const auto data = random_bytes(r.mem.size() - i, 400 + i);
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
      CHECK(first_diff(r.mem.data() + i, data.data(), data.size()) == data.size());
      CHECK(s.wait(preq).rc == HMC_PROV_OK);
      CHECK(s.wait(sreq).rc == HMC_PROV_OK);
    }
  });
}

TEST_CASE("net: a put from another process lands before its next message", "[net][put][process]") {
  for_each_plugin([](Session& s) {
    if (skip_without_put(s) || !s.has(HMC_NET_CAP_MSG)) return;
    char addr[HMC_NET_ADDR_MAX];
    size_t addr_len = 0;
    void* listener = nullptr;
    REQUIRE(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &listener) ==
            HMC_PROV_OK);
    Child child({"put", s.path, std::string(addr, addr_len), std::to_string(seed())});
    void* conn = s.accept(listener, nullptr);
    REQUIRE(conn != nullptr);

    Region r(s, 16 << 20);
    Region gone(s, 1 << 16);
    PutPlan plan{};
    plan.offset = 12345;
    plan.len = r.mem.size() - plan.offset - 100;
    plan.rkey_len = static_cast<uint32_t>(r.rkey.size());
    std::memcpy(plan.rkey, r.rkey.data(), r.rkey.size());
    plan.stale_rkey_len = static_cast<uint32_t>(gone.rkey.size());
    std::memcpy(plan.stale_rkey, gone.rkey.data(), gone.rkey.size());
    gone.dereg();

    uint32_t marker = 0;
    void* mreq = nullptr;
    REQUIRE(s.p->recv_msg(s.state, conn, &marker, sizeof(marker), &mreq) >= 0);
    void* sreq = nullptr;
    REQUIRE(s.p->send_msg(s.state, conn, &plan, sizeof(plan), &sreq) >= 0);
    CHECK(s.wait(sreq).rc == HMC_PROV_OK);
    Outcome o = s.wait(mreq);
    INFO(o.message);
    REQUIRE(o.rc == HMC_PROV_OK);
    REQUIRE(marker == kMarker);
    // Checked when the marker arrived: the data is already there.
    check_region(r, plan.offset, random_bytes(plan.len, kPutSalt));

    PutReport report{};
    void* rreq = nullptr;
    REQUIRE(s.p->recv_msg(s.state, conn, &report, sizeof(report), &rreq) >= 0);
    o = s.wait(rreq);
    REQUIRE(o.rc == HMC_PROV_OK);
    CHECK(report.put_rc == HMC_PROV_OK);
    CHECK(report.stale_rc == HMC_PROV_ERR_OUT_OF_BOUNDS);
    CHECK(first_not(gone.mem.data(), gone.mem.size(), kPoison) == gone.mem.size());

    void* breq = nullptr;
    REQUIRE(s.p->send_msg(s.state, conn, "bye", 4, &breq) >= 0);
    CHECK(s.wait(breq).rc == HMC_PROV_OK);
    int status = child.wait_exit(timeout());
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, listener) == HMC_PROV_OK);
  });
}
