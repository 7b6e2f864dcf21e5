#include "core/path_negotiation.h"

#include <algorithm>
#include <sstream>

#include "hmc/provider/net.h"

namespace hmc::core {

Result<PathPolicy> PathPolicy::parse(const std::string& spec) {
  PathPolicy p;
  if (spec.empty()) return p;
  if (spec.find('=') == std::string::npos) {
    p.forced["same_host"] = p.forced["remote"] = spec;
    return p;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    std::string cls = item.substr(0, eq);
    if (eq == std::string::npos || eq + 1 == item.size() || (cls != "same_host" && cls != "remote"))
      return Status(ErrorCode::kInvalidArgument, "malformed HMC_PATH='" + spec +
                                                     "': expected a provider name or same_host=<provider>,remote=<provider>");
    p.forced[cls] = item.substr(eq + 1);
  }
  return p;
}

double path_cost_us(double latency_us, double bandwidth_gbps, double bytes) {
  return latency_us + (bandwidth_gbps > 0 ? bytes / (bandwidth_gbps * 1e3) : 1e12);
}

Result<PathInfo> negotiate_path(const Card& me, const Card& peer, const PathPolicy& policy) {
  PathInfo info;
  info.peer = peer.rank;
  if (me.rank == peer.rank) {
    info.provider = "self";
    info.reason = "same rank: local copy";
    info.candidates.push_back({"self", true, info.reason, 0, 0, 0});
    return info;
  }
  const bool same_host = me.host_id == peer.host_id;
  const std::string pair_class = same_host ? "same_host" : "remote";
  // Two "hosts" may share a hostname (namespaces or containers told apart by HMC_HOST_ID).
  const std::string peer_host =
      peer.hostname + (!same_host && peer.hostname == me.hostname ? " (host id " + peer.host_id + ")" : "");
  for (const auto& mine : me.nets) {
    PathCandidate c{mine.name, false, "", mine.latency_us, mine.bandwidth_gbps, 0};
    const NetCard* theirs = peer.net(mine.name);
    if (!theirs) {
      c.reason = "peer has no " + mine.name + " provider";
    } else {
      c.latency_us = std::max(mine.latency_us, theirs->latency_us);
      c.bandwidth_gbps = std::min(mine.bandwidth_gbps, theirs->bandwidth_gbps);
      uint64_t caps = mine.caps & theirs->caps;
      if (!(caps & HMC_NET_CAP_MEM_HOST)) c.reason = "cannot touch host memory";
      else if (same_host && !(caps & HMC_NET_CAP_SAME_HOST)) c.reason = "does not reach processes of the same host";
      else if (!same_host && !(caps & HMC_NET_CAP_REMOTE)) c.reason = "same-host only, peer on host " + peer_host;
      else if (!(caps & HMC_NET_CAP_PUT)) c.reason = "no one-sided put (needed for rendezvous)";
      else {
        c.usable = true;
        c.reason = same_host ? "both sides on one host" : "reaches host " + peer_host;
      }
    }
    c.cost_us_1mib = path_cost_us(c.latency_us, c.bandwidth_gbps, 1 << 20);
    info.candidates.push_back(c);
  }
  std::stable_sort(info.candidates.begin(), info.candidates.end(), [](const PathCandidate& a, const PathCandidate& b) {
    if (a.usable != b.usable) return a.usable;
    if (a.cost_us_1mib != b.cost_us_1mib) return a.cost_us_1mib < b.cost_us_1mib;
    return a.provider < b.provider;
  });
  auto forced = policy.forced.find(pair_class);
  if (forced != policy.forced.end()) {
    auto it = std::find_if(info.candidates.begin(), info.candidates.end(),
                           [&](const PathCandidate& c) { return c.provider == forced->second; });
    if (it == info.candidates.end())
      return Status(ErrorCode::kUnavailable, "HMC_PATH forces " + forced->second + " for " + pair_class +
                                                 " pairs but this rank has no such net provider loaded");
    if (!it->usable)
      return Status(ErrorCode::kUnavailable, "HMC_PATH forces " + forced->second + " to rank " +
                                                 std::to_string(peer.rank) + " but: " + it->reason);
    info.provider = it->provider;
    info.reason = "forced by HMC_PATH (" + pair_class + "=" + it->provider + ")";
    return info;
  }
  if (info.candidates.empty() || !info.candidates.front().usable) {
    std::string why;
    for (const auto& c : info.candidates) why += "; " + c.provider + ": " + c.reason;
    return Status(ErrorCode::kUnavailable, "no path to rank " + std::to_string(peer.rank) + " on " + peer.hostname +
                                               (why.empty() ? ": no net provider loaded" : why));
  }
  const auto& best = info.candidates.front();
  info.provider = best.provider;
  std::ostringstream r;
  r << "lowest modelled cost for 1 MiB (" << static_cast<int>(best.cost_us_1mib) << " us";
  if (info.candidates.size() > 1 && info.candidates[1].usable)
    r << " vs " << info.candidates[1].provider << " " << static_cast<int>(info.candidates[1].cost_us_1mib) << " us";
  r << "), " << best.reason;
  info.reason = r.str();
  return info;
}

std::string device_path(const Card& me, const Card& peer, const std::string& provider) {
  if (provider == "self") return "copied by the device's provider";
  std::string staged = "staged through pinned host memory over " + provider;
  if (me.host_id != peer.host_id) return staged;
  auto vendors = [](const Card& c) {
    std::vector<std::string> out;
    for (const auto& d : c.devices)
      if (d.mem_kind == MemKind::kDevice && std::find(out.begin(), out.end(), d.id.provider) == out.end())
        out.push_back(d.id.provider);
    return out;
  };
  std::vector<std::string> common;
  for (const auto& v : vendors(me)) {
    auto theirs = vendors(peer);
    if (std::find(theirs.begin(), theirs.end(), v) != theirs.end()) common.push_back(v);
  }
  if (common.empty()) return "host memory allocated shareable is written through IPC; other device memory is " + staged;
  std::string names;
  for (const auto& v : common) names += (names.empty() ? "" : ", ") + v;
  return "IPC for " + names + " memory and shareable host memory; other device memory is " + staged;
}

}  // namespace hmc::core
