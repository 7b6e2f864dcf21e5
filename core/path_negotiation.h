// Path negotiation: for one peer pair, the candidate paths, why each is usable or not,
// ranked by a cost model, and the choice. Both sides run it on the same two cards and
// reach the same answer (the model uses the worse figure of the two sides).
#pragma once

#include <map>
#include <string>

#include "core/card.h"
#include "hmc/communicator.h"

namespace hmc::core {

// HMC_PATH: "" (choose), "tcp" (every pair), or "same_host=shm,remote=tcp".
struct PathPolicy {
  std::map<std::string, std::string> forced;  // pair class ("same_host", "remote") -> provider
  static Result<PathPolicy> parse(const std::string& spec);
};

// The model's cost of moving `bytes` over a path: latency + bytes / bandwidth.
double path_cost_us(double latency_us, double bandwidth_gbps, double bytes);

Result<PathInfo> negotiate_path(const Card& me, const Card& peer, const PathPolicy& policy);
// How device memory reaches `peer` over the chosen net `provider`, in words: IPC for the
// device providers both sides of one host have, host staging otherwise.
std::string device_path(const Card& me, const Card& peer, const std::string& provider);

}  // namespace hmc::core
