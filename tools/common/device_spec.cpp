// Parsing --device and picking this rank's device (see device_spec.h).
#include "device_spec.h"

#include <charconv>

namespace hmc::tools {
namespace {

bool parse_int(std::string_view s, int& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

Status bad(const std::string& text, const std::string& why) {
  return Status(ErrorCode::kInvalidArgument, "--device '" + text + "': " + why +
                                                 " (use provider[:index][@ranks], e.g. cuda, cuda:1, cuda@0,1, cuda@0-3)");
}

}  // namespace

std::string DeviceSpec::provider_of(int r) const {
  if (ranks.empty()) return provider;
  for (auto [lo, hi] : ranks)
    if (r >= lo && r <= hi) return provider;
  return "cpu";
}

Result<DeviceSpec> parse_device_spec(const std::string& text) {
  DeviceSpec spec;
  spec.text = text;
  std::string_view dev = text, ranks;
  if (auto at = dev.find('@'); at != std::string_view::npos) {
    ranks = dev.substr(at + 1);
    dev = dev.substr(0, at);
    if (ranks.empty()) return bad(text, "no ranks after '@'");
  }
  auto colon = dev.find(':');
  spec.provider = std::string(dev.substr(0, colon));
  if (spec.provider.empty()) return bad(text, "no provider");
  if (colon != std::string_view::npos && !parse_int(dev.substr(colon + 1), spec.index))
    return bad(text, "bad device index");
  while (!ranks.empty()) {
    auto comma = ranks.find(',');
    std::string_view item = ranks.substr(0, comma);
    ranks = comma == std::string_view::npos ? std::string_view{} : ranks.substr(comma + 1);
    auto dash = item.find('-');
    int lo = 0, hi = 0;
    if (!parse_int(item.substr(0, dash), lo) ||
        !parse_int(dash == std::string_view::npos ? item : item.substr(dash + 1), hi) || hi < lo)
      return bad(text, "bad rank list");
    spec.ranks.emplace_back(lo, hi);
  }
  return spec;
}

Status check_ranks(const DeviceSpec& spec, int ranks) {
  for (auto [lo, hi] : spec.ranks)
    if (hi >= ranks)
      return Status(ErrorCode::kInvalidArgument,
                    "--device '" + spec.text + "': names rank " + std::to_string(hi) + ", but the job has " +
                        std::to_string(ranks) + (ranks == 1 ? " rank (0)" : " ranks (0-" + std::to_string(ranks - 1) + ")"));
  return {};
}

Result<DeviceId> pick_device(const Context& ctx, const Communicator& comm, const DeviceSpec& spec) {
  HMC_RETURN_IF_ERROR(check_ranks(spec, comm.size()));
  const int me = comm.rank();
  const std::string provider = spec.provider_of(me);
  int count = 0;
  for (const auto& d : ctx.devices()) count += d.id.provider == provider;
  if (count == 0) return Status(ErrorCode::kNotFound, "no device of provider '" + provider + "' here (see hmc-probe)");
  if (provider == spec.provider && spec.index >= 0) {
    if (spec.index >= count)
      return Status(ErrorCode::kInvalidArgument,
                    "device " + provider + ":" + std::to_string(spec.index) + " outside [0, " + std::to_string(count) + ")");
    return DeviceId{provider, spec.index};
  }
  // Local rank among the ranks of this host that use the same provider.
  int local = 0;
  for (int r = 0; r < me; ++r) local += comm.peer(r).host == comm.peer(me).host && spec.provider_of(r) == provider;
  return DeviceId{provider, local % count};
}

}  // namespace hmc::tools
