#include "collectives/select.h"

#include <array>
#include <vector>

#include "collectives/settings.h"
#include "core/config.h"

namespace hmc::coll {
namespace {

constexpr std::array<const char*, kNumCollKinds> kKindNames = {
    "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
    "gather", "scatter", "all_to_all", "all_to_all_v", "barrier"};

constexpr std::array<const char*, 8> kAlgoNames = {"auto", "ring", "rd", "rhd", "tree", "pairwise", "linear", "dissemination"};

// Thresholds of the automatic choice, from hmc-bench sweeps of every algorithm on the
// 2-core host with shm, 2 to 4 ranks (docs/collectives.md). Since shm carries messages
// in shared-memory rings (a few microseconds each), all_reduce is ring above 64 KiB:
// at 512 KiB it took 140 us against 240 (rd) and 380-1900 (tree) with 2 ranks, and
// 770 us against 980 (rhd) and 2300-3200 (tree) with 4.
constexpr std::size_t kAllReduceRdMax = 16 << 10;     // recursive doubling up to here,
constexpr std::size_t kAllReduceRhdMax = 64 << 10;    // then Rabenseifner, then ring
constexpr std::size_t kGatherRdMax = 64 << 20;        // all_gather / reduce_scatter, power-of-two ranks: total bytes
constexpr std::size_t kTreeMax = 64 << 10;            // broadcast / reduce: binomial up to here, then chain
constexpr std::size_t kAllToAllLinearMax = 256 << 10; // per-peer block, above 4 ranks

std::vector<Algo> allowed(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return {Algo::kRing, Algo::kRd, Algo::kRhd, Algo::kTree};
    case CollKind::kReduce:
    case CollKind::kBroadcast: return {Algo::kTree, Algo::kRing};
    case CollKind::kAllGather: return {Algo::kRing, Algo::kRd};
    case CollKind::kReduceScatter: return {Algo::kRing, Algo::kRd, Algo::kRhd};
    case CollKind::kAllToAll:
    case CollKind::kAllToAllV: return {Algo::kPairwise, Algo::kLinear};
    case CollKind::kGather:
    case CollKind::kScatter: return {Algo::kLinear};
    case CollKind::kBarrier: return {Algo::kDissemination};
  }
  return {};
}

std::optional<Algo> parse_algo(const std::string& s) {
  for (std::size_t i = 1; i < kAlgoNames.size(); ++i)
    if (s == kAlgoNames[i]) return static_cast<Algo>(i);
  if (s == "auto" || s.empty()) return Algo::kAuto;
  return std::nullopt;
}

bool applies(CollKind k, Algo a) {
  if (a == Algo::kAuto) return true;
  for (Algo b : allowed(k))
    if (a == b) return true;
  return false;
}

std::string allowed_text(CollKind k) {
  std::string s;
  for (Algo a : allowed(k)) s += (s.empty() ? "" : ", ") + std::string(algo_name(a));
  return s;
}

Algo by_rule(CollKind k, std::size_t bytes, int n) {
  switch (k) {
    case CollKind::kAllReduce:
      if (bytes <= kAllReduceRdMax) return Algo::kRd;
      if (bytes <= kAllReduceRhdMax) return Algo::kRhd;
      return Algo::kRing;
    case CollKind::kAllGather:
    case CollKind::kReduceScatter: return is_pow2(n) && bytes <= kGatherRdMax ? Algo::kRd : Algo::kRing;
    case CollKind::kReduce:
    case CollKind::kBroadcast: return n <= 2 || bytes <= kTreeMax ? Algo::kTree : Algo::kRing;
    case CollKind::kAllToAll:
    case CollKind::kAllToAllV: return n <= 4 || bytes <= kAllToAllLinearMax ? Algo::kLinear : Algo::kPairwise;
    case CollKind::kGather:
    case CollKind::kScatter: return Algo::kLinear;
    case CollKind::kBarrier: return Algo::kDissemination;
  }
  return Algo::kRing;
}

// HMC_ALGO: "ring" for every collective it applies to, or "all_reduce=ring,all_gather=rd".
Result<Algo> from_config(const core::Config& cfg, CollKind k) {
  auto text = cfg.text("HMC_ALGO");
  if (!text || text->empty()) return Algo::kAuto;
  const std::string& v = *text;
  if (v.find('=') == std::string::npos) {
    auto a = parse_algo(v);
    if (!a) return Status(ErrorCode::kInvalidArgument, "malformed HMC_ALGO='" + v + "': unknown algorithm '" + v + "'");
    return applies(k, *a) ? *a : Algo::kAuto;  // a global choice skips collectives it does not fit
  }
  Algo found = Algo::kAuto;
  std::size_t pos = 0;
  while (pos <= v.size()) {
    std::size_t end = v.find(',', pos);
    if (end == std::string::npos) end = v.size();
    std::string item = v.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string name = item.substr(0, eq), algo = eq == std::string::npos ? "" : item.substr(eq + 1);
    int kind = -1;
    for (uint32_t i = 0; i < kNumCollKinds; ++i)
      if (name == kKindNames[i]) kind = static_cast<int>(i);
    auto a = parse_algo(algo);
    if (kind < 0 || eq == std::string::npos || !a)
      return Status(ErrorCode::kInvalidArgument, "malformed HMC_ALGO='" + v + "': '" + item + "' is not <collective>=<algorithm>");
    if (!applies(static_cast<CollKind>(kind), *a))
      return Status(ErrorCode::kInvalidArgument, "malformed HMC_ALGO='" + v + "': " + name + " has no algorithm '" + algo +
                                                     "' (" + allowed_text(static_cast<CollKind>(kind)) + ")");
    if (static_cast<CollKind>(kind) == k) found = *a;
  }
  return found;
}

}  // namespace

const char* coll_kind_name(CollKind k) { return kKindNames[static_cast<uint32_t>(k)]; }
const char* algo_name(Algo a) {
  auto i = static_cast<std::size_t>(a);
  return i < kAlgoNames.size() ? kAlgoNames[i] : "?";
}

CollSettings CollSettings::read(const core::Config& cfg) {
  CollSettings s;
  auto algo = cfg.text("HMC_ALGO");
  s.algo_set = algo && !algo->empty();
  for (uint32_t k = 0; k < kNumCollKinds && s.algo_set; ++k) {
    auto a = from_config(cfg, static_cast<CollKind>(k));
    if (!a) {
      s.algo_error = a.status();
      break;
    }
    s.algo[k] = a.value();
  }
  s.check = cfg.flag("HMC_COLL_CHECK");
  s.chunk = cfg.size("HMC_COLL_CHUNK");
  s.shm_max = cfg.size("HMC_SHM_COLL_MAX");
  s.max_chunks = cfg.integer("HMC_COLL_MAX_CHUNKS");
  s.ccl = cfg.str("HMC_CCL");
  s.stream_stage = cfg.flag("HMC_STREAM_STAGE");
  s.stream_stage_max = cfg.size("HMC_STREAM_STAGE_MAX");
  return s;
}

Result<Algo> choose_algorithm(const CollSettings& settings, CollKind kind, const std::string& requested,
                              std::size_t bytes, int size) {
  Algo a = Algo::kAuto;
  if (!requested.empty()) {
    auto parsed = parse_algo(requested);
    if (!parsed || !applies(kind, *parsed))
      return Status(ErrorCode::kInvalidArgument, std::string(coll_kind_name(kind)) + " has no algorithm '" + requested +
                                                     "' (" + allowed_text(kind) + ")");
    a = *parsed;
  } else {
    if (!settings.algo_error.ok()) return settings.algo_error;
    a = settings.algo[static_cast<uint32_t>(kind)];
  }
  if (a == Algo::kAuto) a = by_rule(kind, bytes, size);
  return a;
}

}  // namespace hmc::coll
