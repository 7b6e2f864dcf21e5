// A listener's port setting (HMC_TCP_PORT, HMC_UCX_PORT): "0" for an ephemeral port, "N" for
// that port, or "LO-HI" for the first free one of the range. Several ranks of one host, and
// several communicators of one process, each need a listener of their own: a single fixed
// port served only the first (the others lost the provider, with a warning).
#pragma once

#include <charconv>
#include <cstdint>
#include <string>

namespace hmc_net {

struct PortRange {
  uint16_t lo = 0, hi = 0;  // 0-0: an ephemeral port
};

// False with `why` naming `name` for text that is none of the three forms.
inline bool parse_port_range(const std::string& name, const std::string& text, PortRange& out, std::string& why) {
  auto number = [](const char* begin, const char* end, uint16_t& v) {
    unsigned long n = 0;
    auto [ptr, ec] = std::from_chars(begin, end, n);
    if (ec != std::errc() || ptr != end || begin == end || n > 65535) return false;
    v = static_cast<uint16_t>(n);
    return true;
  };
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto dash = text.find('-');
  bool ok;
  if (dash == std::string::npos) {
    ok = number(begin, end, out.lo);
    out.hi = out.lo;
  } else {
    ok = number(begin, begin + dash, out.lo) && number(begin + dash + 1, end, out.hi) && out.lo > 0 && out.lo <= out.hi;
  }
  if (!ok) why = name + "='" + text + "': expected 0 (any free port), a port, or a range LO-HI of ports from 1 to 65535";
  return ok;
}

// Calls bind_at(port) for each port of `r` in turn (0 once: an ephemeral port) until it
// returns true, or it failed other than for the port being in use (in_use() false), or the
// range is spent. Returns the port tried last.
template <class Bind, class InUse>
uint16_t first_free_port(const PortRange& r, Bind&& bind_at, InUse&& in_use) {
  for (uint16_t p = r.lo;; ++p)
    if (bind_at(p) || !in_use() || p >= r.hi) return p;
}

// Why a listener could not bind where every port of a range was in use.
inline std::string ports_taken(const std::string& name, const PortRange& r, const std::string& where) {
  return "every port of " + name + "=" + std::to_string(r.lo) + "-" + std::to_string(r.hi) + " is in use on " + where;
}

}  // namespace hmc_net
