// --device for HMC's tools: which device each rank's buffers live on.
//
//   cpu              every rank on host memory (the default)
//   cuda             every rank on a cuda device: index = this rank's place among the ranks
//                    of its host that use cuda, modulo the cuda devices it sees
//   cuda:1           every rank on cuda device 1
//   cuda@0,1         ranks 0 and 1 on cuda (as above), every other rank on cpu: a mixed job
//   cuda@0-3,6       ranges and lists; ranks outside them use cpu
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hmc/hmc.h"

namespace hmc::tools {

struct DeviceSpec {
  std::string text;       // as given
  std::string provider = "cpu";
  int index = -1;         // -1: by local rank
  std::vector<std::pair<int, int>> ranks;  // inclusive ranges; empty = every rank
  bool mixed() const { return !ranks.empty(); }
  // The provider rank `r` uses: `provider`, or cpu for ranks outside `ranks`.
  std::string provider_of(int r) const;
};

Result<DeviceSpec> parse_device_spec(const std::string& text);

// An error where `spec`'s rank list names a rank outside [0, ranks): it would put no rank
// on the device it names. pick_device checks it; a launcher that knows the count checks first.
Status check_ranks(const DeviceSpec& spec, int ranks);

// This rank's device; the ranks of the communicator must all pass the same spec, whose
// rank list must lie within the communicator (check_ranks).
Result<DeviceId> pick_device(const Context& ctx, const Communicator& comm, const DeviceSpec& spec);

}  // namespace hmc::tools
