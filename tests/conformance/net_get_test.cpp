// Gets (HMC_NET_CAP_GET): the bytes at the offset and nothing else, refusals, and
// the promise behind the provider's rendezvous advice.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>

#include "net_kit.h"
#include "net_region.h"

using namespace hmc_conformance;

namespace {

// A destination of `len` bytes and a poisoned guard on either side.
struct Dest {
  static constexpr size_t kGuard = 64;
  explicit Dest(size_t len) : bytes(len + 2 * kGuard, static_cast<char>(kPoison)), len(len) {}
  char* data() { return bytes.data() + kGuard; }
  bool untouched() const { return first_not(bytes.data(), bytes.size(), kPoison) == bytes.size(); }
  // Holds `want` and the guards are intact.
  void check(const char* want) {
    CHECK(first_not(bytes.data(), kGuard, kPoison) == kGuard);
    CHECK(first_diff(data(), want, len) == len);
    CHECK(first_not(data() + len, kGuard, kPoison) == kGuard);
  }
  std::vector<char> bytes;
  size_t len;
};

Outcome get_outcome(Session& s, void* conn, char* dst, size_t len, const std::vector<uint8_t>& rkey, uint64_t offset) {
  void* req = nullptr;
  int rc = s.p->get(s.state, conn, dst, len, nullptr, rkey.data(), rkey.size(), offset, &req);
  if (rc < 0 || req == nullptr) {
    Outcome o;
    o.rc = rc < 0 ? rc : HMC_PROV_ERR_INTERNAL;
    o.message = rc < 0 ? "(refused by get itself)" : "get returned no request";
    return o;
  }
  return s.wait(req);
}

// The provider advises gets for peers on this host: it must then read its own mem_alloc
// memory (what the host's rendezvous gets from) rather than refuse it.
bool advises_same_host_gets(Session& s) {
  hmc_net_props_t props{};
  props.struct_size = sizeof(props);
  REQUIRE(s.p->props(s.state, &props) == HMC_PROV_OK);
  return props.rndv_get_max_same_host != 0;
}

void for_each_get_pair(const std::function<void(Session&, Session&, Link&)>& body) {
  for_each_pair_with(HMC_NET_CAP_GET, "get", body);
}

}  // namespace

TEST_CASE("net: a get reads the bytes at the offset of the registered region", "[net][get]") {
  for_each_get_pair([](Session& s, Session& t, Link& link) {
    const bool must = advises_same_host_gets(s);
    uint64_t salt = 400;
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem) << (must ? " (the provider advises same-host gets)" : ""));
      for (bool forward : {true, false}) {
        Session& from = forward ? s : t;
        Session& owner = forward ? t : s;
        void* conn = forward ? link.a : link.b;
        INFO((forward ? "connector reads the acceptor's region" : "acceptor reads the connector's region"));
        for (auto [region_len, offset, len] : {std::tuple<size_t, uint64_t, size_t>{1 << 20, 4099, 100000},
                                               {4096, 0, 4096},
                                               {4096, 4095, 1},
                                               {4096, 17, 0},
                                               {16 << 20, 0, 16 << 20}}) {
          INFO("get of " << len << " bytes at " << offset << " from " << region_len);
          Region r(owner, region_len, mem, 64);
          const auto data = random_bytes(region_len, ++salt);
          std::memcpy(r.data(), data.data(), region_len);
          Dest d(len);
          Outcome o = get_outcome(from, conn, d.data(), len, r.rkey, offset);
          INFO("rc " << o.rc << " " << o.message);
          REQUIRE_FALSE(o.timed_out);
          if (o.rc == HMC_PROV_ERR_INVALID && !(must && mem == Mem::provider)) {
            CHECK(d.untouched());  // refused: the host puts instead
            continue;
          }
          REQUIRE(o.rc == HMC_PROV_OK);
          CHECK(o.done);
          CHECK(o.bytes == len);
          d.check(data.data() + offset);
          CHECK(first_diff(r.data(), data.data(), region_len) == region_len);  // read, not written
          CHECK(first_not(r.data() + region_len, 64, kPoison) == 64);
        }
      }
    }
  });
}

TEST_CASE("net: gets past the end or with a stale or forged key are refused", "[net][get]") {
  for_each_get_pair([](Session& s, Session& t, Link& link) {
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      Region r(t, 1 << 20, mem, 4096);
      const uint64_t len = r.size();
      Dest d(1 << 16);
      auto refused = [&](const std::vector<uint8_t>& rkey, uint64_t offset, size_t n) {
        Outcome o = get_outcome(s, link.a, d.data(), n, rkey, offset);
        INFO("get of " << n << " bytes at offset " << offset << ": rc " << o.rc << " " << o.message);
        CHECK_FALSE(o.timed_out);
        return o.rc;
      };
      CHECK(refused(r.rkey, len - 10, 100) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(refused(r.rkey, len + 1, 1) == HMC_PROV_ERR_OUT_OF_BOUNDS);
      CHECK(refused(r.rkey, UINT64_MAX - 4, 16) == HMC_PROV_ERR_OUT_OF_BOUNDS);

      // The key of a deregistered region, never used on this connection before.
      Region gone(t, 1 << 16, mem);
      const auto stale = gone.rkey;
      gone.dereg();
      int rc = refused(stale, 0, 64);
      CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));

      std::vector<uint8_t> forged(r.rkey.size());
      fill_random(reinterpret_cast<char*>(forged.data()), forged.size(), 401);
      rc = refused(forged, 0, 64);
      CHECK((rc == HMC_PROV_ERR_OUT_OF_BOUNDS || rc == HMC_PROV_ERR_INVALID));
      CHECK(d.untouched());
      CHECK(untouched(r));
    }
  });
}

// The host's rendezvous between ranks of one host (the split, taking turns) has gets and
// puts under way on one connection at once, from and into different regions: eight of each
// in flight, taken in turns, before the first is waited for. Every get holds its slot of
// the source and every put lands whole in its own; the source is only read. Memory whose
// gets the provider refuses (a heap the peer cannot map) is skipped: the host puts there.
TEST_CASE("net: gets and puts in flight at once on one connection each land whole", "[net][get][put]") {
  for_each_get_pair([](Session& s, Session& t, Link& link) {
    if (!s.has(HMC_NET_CAP_PUT)) return;
    constexpr int kEach = 8;
    constexpr size_t kLen = (64 << 10) + 64;
    uint64_t salt = 450;
    for (Mem mem : with_provider(s, {Mem::heap, Mem::shared})) {
      INFO(mem_name(mem));
      Region from(t, kEach * kLen, mem, 64), into(t, kEach * kLen, mem, 64);
      const auto source = random_bytes(from.size(), ++salt);
      std::memcpy(from.data(), source.data(), source.size());
      const auto sent = random_bytes(into.size(), ++salt);
      std::vector<Dest> got;
      for (int i = 0; i < kEach; ++i) got.emplace_back(kLen);
      Outcome probe = get_outcome(s, link.a, got[0].data(), kLen, from.rkey, 0);
      if (probe.rc == HMC_PROV_ERR_INVALID && !(advises_same_host_gets(s) && mem == Mem::provider)) continue;
      REQUIRE(probe.rc == HMC_PROV_OK);
      std::vector<std::pair<void*, std::string>> reqs;
      for (int i = 0; i < kEach; ++i) {
        void* g = nullptr;
        void* p = nullptr;
        REQUIRE(s.p->get(s.state, link.a, got[i].data(), kLen, nullptr, from.rkey.data(), from.rkey.size(), i * kLen, &g) ==
                HMC_PROV_OK);
        REQUIRE(s.p->put(s.state, link.a, sent.data() + i * kLen, kLen, nullptr, into.rkey.data(), into.rkey.size(),
                         i * kLen, &p) == HMC_PROV_OK);
        reqs.emplace_back(g, "get " + std::to_string(i));
        reqs.emplace_back(p, "put " + std::to_string(i));
      }
      for (auto& [req, what] : reqs) {
        INFO(what);
        REQUIRE(req != nullptr);
        Outcome o = s.wait(req);
        INFO("rc " << o.rc << " " << o.message);
        REQUIRE_FALSE(o.timed_out);
        CHECK(o.rc == HMC_PROV_OK);
        CHECK(o.done);
        CHECK(o.bytes == kLen);
      }
      for (int i = 0; i < kEach; ++i) {
        INFO("slot " << i);
        got[i].check(source.data() + i * kLen);
      }
      check_region(into, 0, sent);
      CHECK(first_diff(from.data(), source.data(), from.size()) == from.size());  // read, not written
      CHECK(first_not(from.data() + from.size(), 64, kPoison) == 64);
    }
  });
}
