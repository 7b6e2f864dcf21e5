// Path negotiation: candidates, reasons, cost ranking, HMC_PATH.

#include <catch2/catch.hpp>
#include <functional>

#include "core/path_negotiation.h"
#include "hmc/context.h"
#include "core/registration.h"
#include "hmc/provider/net.h"
#include "stderr_capture.h"

using namespace hmc;
using namespace hmc::core;
using hmc::test::stderr_of;

namespace {

constexpr uint64_t kTcpCaps = HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST | HMC_NET_CAP_MEM_HOST;
constexpr uint64_t kShmCaps = HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_SAME_HOST | HMC_NET_CAP_MEM_HOST;

Card card(int rank, const std::string& host, bool with_shm = true) {
  Card c;
  c.rank = rank;
  c.host_id = host;
  c.hostname = host;
  c.nets.push_back({"tcp", kTcpCaps, {}, 20, 3});
  if (with_shm) c.nets.push_back({"shm", kShmCaps, {}, 5, 10});
  return c;
}

PathPolicy policy(const std::string& spec) { return PathPolicy::parse(spec).value(); }

}  // namespace

TEST_CASE("same host prefers shm, other hosts get tcp with reasons", "[path]") {
  auto same = negotiate_path(card(0, "a"), card(1, "a"), policy(""));
  REQUIRE(same.ok());
  CHECK(same->provider == "shm");
  CHECK_THAT(same->reason, Catch::Contains("lowest modelled cost") && Catch::Contains("tcp"));
  REQUIRE(same->candidates.size() == 2);
  CHECK(same->candidates[0].cost_us_1mib < same->candidates[1].cost_us_1mib);

  auto remote = negotiate_path(card(0, "a"), card(1, "b"), policy(""));
  REQUIRE(remote.ok());
  CHECK(remote->provider == "tcp");
  CHECK_FALSE(remote->candidates.back().usable);
  CHECK_THAT(remote->candidates.back().reason, Catch::Contains("same-host only"));

  auto self = negotiate_path(card(0, "a"), card(0, "a"), policy(""));
  CHECK(self->provider == "self");
}

TEST_CASE("a provider that reaches only this host loses remote pairs, named by host id", "[path]") {
  // Two namespaces of one machine: one hostname, two host ids. ucx with shared memory only
  // (UCX_TLS=shm) withdraws remote; its low cost must not win the pair.
  Card a = card(0, "ns-a"), b = card(1, "ns-b");
  a.hostname = b.hostname = "box";
  for (Card* c : {&a, &b}) c->nets.push_back({"ucx", kShmCaps, {}, 1, 50});
  auto ab = negotiate_path(a, b, policy(""));
  REQUIRE(ab.ok());
  CHECK(ab->provider == "tcp");
  CHECK_THAT(ab->reason, Catch::Contains("reaches host box (host id ns-b)"));
  for (const auto& c : ab->candidates)
    if (c.provider == "ucx") CHECK_THAT(c.reason, Catch::Contains("same-host only, peer on host box (host id ns-b)"));
  // One side's ucx reaches other hosts, the other's does not: the pair cannot use it.
  a.nets.back().caps |= HMC_NET_CAP_REMOTE;
  auto forced = negotiate_path(a, b, policy("ucx"));
  REQUIRE_FALSE(forced.ok());
  CHECK_THAT(forced.status().message(), Catch::Contains("same-host only"));
  // On one host the same provider wins on cost.
  b.host_id = "ns-a";
  CHECK(negotiate_path(a, b, policy(""))->provider == "ucx");
}

TEST_CASE("the model is symmetric: both sides choose the same path", "[path]") {
  Card a = card(0, "h"), b = card(1, "h");
  b.nets[1].bandwidth_gbps = 1;  // b's shm is slow: both must see the slow figure
  auto ab = negotiate_path(a, b, policy(""));
  auto ba = negotiate_path(b, a, policy(""));
  CHECK(ab->provider == ba->provider);
  CHECK(ab->candidates[0].cost_us_1mib == Approx(ba->candidates[0].cost_us_1mib));
}

TEST_CASE("HMC_PATH forces a provider or fails with the reason", "[path]") {
  auto forced = negotiate_path(card(0, "a"), card(1, "a"), policy("tcp"));
  REQUIRE(forced.ok());
  CHECK(forced->provider == "tcp");
  CHECK_THAT(forced->reason, Catch::Contains("forced by HMC_PATH"));
  auto per_class = negotiate_path(card(0, "a"), card(1, "b"), policy("same_host=shm,remote=tcp"));
  CHECK(per_class->provider == "tcp");
  auto impossible = negotiate_path(card(0, "a"), card(1, "b"), policy("shm"));
  REQUIRE_FALSE(impossible.ok());
  CHECK_THAT(impossible.status().message(), Catch::Contains("same-host only"));
  auto missing = negotiate_path(card(0, "a"), card(1, "a"), policy("ucx"));
  CHECK_THAT(missing.status().message(), Catch::Contains("no such net provider"));
  CHECK_FALSE(PathPolicy::parse("same_host=").ok());
  CHECK_FALSE(PathPolicy::parse("sideways=tcp").ok());
  auto typo = Context::create({{{"HMC_PATH", "samehost=shm,remote=tcp"}}});
  REQUIRE_FALSE(typo.ok());
  CHECK(typo.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(typo.status().message(), Catch::Contains("malformed HMC_PATH"));
  // A provider name nobody found is warned about at Context::create (a typo, or a plugin
  // this node lacks under a cluster-wide setting); the pairs that need it fail later.
  bool made = false;
  const std::string said = stderr_of([&] { made = Context::create({{{"HMC_PATH", "tpc"}}}).ok(); });
  CHECK(made);
  CHECK_THAT(said, Catch::Contains("HMC_PATH forces 'tpc'") && Catch::Contains("tcp"));
  // One that was found but not selected is no typo: no warning.
  const std::string quiet = stderr_of([&] {
    made = Context::create({{{"HMC_PATH", "remote=tcp"}, {"HMC_PROVIDERS", "cpu,shm"}}}).ok();
  });
  CHECK(made);
  CHECK_THAT(quiet, !Catch::Contains("HMC_PATH forces"));
  // A deadline under a millisecond is rounded up, not refused as "not positive".
  auto quick = Context::create({{{"HMC_TIMEOUT", "500us"}}});
  INFO(quick.status().to_string());
  CHECK(quick.ok());
  auto none = negotiate_path(card(0, "a", false), card(1, "b", false), policy(""));
  CHECK(none->provider == "tcp");
  Card bare = card(1, "b");
  bare.nets.clear();
  auto unreachable = negotiate_path(card(0, "a"), bare, policy(""));
  REQUIRE_FALSE(unreachable.ok());
  CHECK_THAT(unreachable.status().message(), Catch::Contains("no path to rank 1"));
}

TEST_CASE("cards and remote keys survive encoding, garbage is refused", "[wire]") {
  Card c = card(3, "host-x");
  c.pid = 42;
  c.nets[0].address = {1, 2, 3, 4};
  c.devices.push_back({{"cpu", 0}, "cpu", "model", "", 0, MemKind::kHost, 1 << 30});
  auto back = decode_card(encode_card(c));
  REQUIRE(back.ok());
  CHECK(back->rank == 3);
  CHECK(back->pid == 42);
  CHECK(back->nets[0].address == std::vector<uint8_t>{1, 2, 3, 4});
  CHECK(back->devices[0].memory_bytes == 1u << 30);
  CHECK_FALSE(decode_card({0xff, 0x00, 0x12}).ok());
  // A peer's malformed card fails with a status: a wrong type for the version threw out
  // of decode_card, and 100000 nested arrays overflowed the CBOR reader's stack.
  CHECK(decode_card({0xa1, 0x61, 'v', 0x61, '1'}).status().code() == ErrorCode::kMismatch);  // {"v": "1"}
  std::vector<uint8_t> deep(100000, 0x81);  // [[[...]]]
  deep.push_back(0x00);
  CHECK(decode_card(deep).status().code() == ErrorCode::kMismatch);

  std::vector<uint8_t> region(100);
  Registration reg(region.data(), region.size());
  const auto packed_key = reg.pack();  // find() reads these bytes in place
  auto key = unpack_key(packed_key);
  REQUIRE(key.ok());
  CHECK(key->region_bytes == 100);
  CHECK(key->find("self").has_value());
  CHECK(key->find("self")->size() == 24);  // pid, address, region id
  CHECK_FALSE(key->find("nope").has_value());
  auto packed = reg.pack();
  packed.resize(packed.size() - 3);
  CHECK_FALSE(unpack_key(packed).ok());
  const std::vector<uint8_t> garbage = {1, 2, 3};
  CHECK_FALSE(unpack_key(garbage).ok());
}
