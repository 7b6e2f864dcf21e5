// Printing what hmc-probe found: tables for people, JSON for scripts.
#include <cstdio>

#include "core/plugin_registry.h"
#include "probe.h"

namespace hmc::probe {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "-" : s;
}

std::string human(std::size_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && i < 3) v /= 1024, ++i;
  char s[32];
  // Whole units as such ("64 KiB"); others keep what they are ("1.5 MiB", not "2 MiB").
  std::snprintf(s, sizeof(s), v == static_cast<double>(static_cast<uint64_t>(v)) ? "%.0f %s" : "%.4g %s", v, u[i]);
  return s;
}

// 65536 -> "64K": one word, for a table column.
std::string short_size(std::size_t b) {
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b / 1024) + "K";
  return std::to_string(b);
}

}  // namespace

nlohmann::json providers_json(const Context& ctx) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : ctx.providers())
    j.push_back({{"name", p.name}, {"kind", p.kind}, {"origin", p.origin}, {"abi_version", p.abi_version},
                 {"caps", p.cap_names}, {"available", p.available}, {"reason", p.reason}});
  return j;
}

void print_overview(const Context& ctx) {
  std::printf("Providers\n  %-8s %-6s %-4s %-11s %-44s %s\n", "name", "kind", "abi", "status", "capabilities", "origin / reason");
  for (const auto& p : ctx.providers())
    std::printf("  %-8s %-6s %-4u %-11s %-44s %s\n", p.name.c_str(), p.kind.c_str(), p.abi_version,
                p.available ? "available" : "no", join(p.cap_names).c_str(), p.available ? p.origin.c_str() : p.reason.c_str());
  std::printf("\nDevices\n  %-8s %-8s %-40s %-14s %-5s %s\n", "id", "vendor", "model", "pci", "numa", "memory");
  for (const auto& d : ctx.devices())
    std::printf("  %-8s %-8s %-40.40s %-14s %-5d %s\n", d.id.to_string().c_str(), d.vendor.c_str(), d.model.c_str(),
                d.pci_bus_id.empty() ? "-" : d.pci_bus_id.c_str(), d.numa_node, human(d.memory_bytes).c_str());
  std::printf("\n");
  print_config(ctx);
}

void print_config(const Context& ctx) {
  std::printf("Configuration (environment variables; 'foreign' ones belong to launchers)\n");
  std::printf("  %-24s %-9s %-10s %-10s %s\n", "name", "type", "default", "value", "help");
  for (const auto& e : ctx.config())
    std::printf("  %-24s %-9s %-10s %-10s %s\n", e.name.c_str(), e.type.c_str(),
                e.default_value.empty() ? "-" : e.default_value.c_str(),
                e.source == "default" ? "" : (e.value + " (" + e.source + ")").c_str(), e.help.c_str());
}

void print_matrix(int size, const std::vector<PairFigures>& figs, const MeasureOptions& opt, double memcpy_ref,
                  double tcp_ref) {
  const std::size_t bytes = opt.bytes;
  std::printf("Path matrix (%d ranks; bandwidth one way with %s %s%s, latency half a round trip of 8 B%s, "
              "%d of them, after %d untimed)\n",
              size, human(bytes).c_str(), opt.put ? (opt.notify ? "notified puts" : "puts") : "messages",
              opt.rotate ? " into 4 buffers in turn" : "", opt.lat_poll ? ", polled" : "",
              opt.lat_iters, opt.lat_warmup);
  std::printf("  %-5s %-5s %-8s %-8s %-6s %10s %10s %8s  %-7s %-11s %-6s %-5s %s\n", "from", "to", "buffer", "peer buf", "path",
              "GB/s", "lat us", "poll ns", "eager", "get", "split", "turns", "why");
  for (const auto& f : figs) {
    // "512K": gets up to 512 KiB; "512K,1536K+": and from 1.5 MiB up.
    std::string get = f.get_limit == 0 ? "-" : f.get_limit == SIZE_MAX ? "any" : short_size(f.get_limit);
    if (f.get_limit != 0 && f.get_from != SIZE_MAX) get += "," + short_size(f.get_from) + "+";
    // "128K+": rendezvous from 128 KiB up are split between the two ranks.
    const std::string split = f.split_from == SIZE_MAX ? "-" : f.split_from == 0 ? "any" : short_size(f.split_from) + "+";
    // "64K+": unsplit rendezvous from 64 KiB up that the receiver could get are copied in turns.
    const std::string turns = f.turns_from == SIZE_MAX ? "-" : short_size(f.turns_from) + "+";
    std::printf("  %-5d %-5d %-8s %-8s %-6s %10.2f %10.2f %8.0f  %-7s %-11s %-6s %-5s %s%s%s\n", f.from, f.to,
                f.from_device.c_str(), f.to_device.c_str(), f.provider.c_str(), f.bandwidth_gbps, f.latency_us, f.poll_ns,
                short_size(f.eager_limit).c_str(), get.c_str(), split.c_str(), turns.c_str(), f.reason.c_str(), f.device_path.empty() ? "" : "; device memory: ", f.device_path.c_str());
  }
  // 0: not measured (the heap could not give the reference's buffers, or loopback TCP failed).
  auto gbps = [](double ref) {
    char s[32] = "not measured";
    if (ref > 0) std::snprintf(s, sizeof s, "%.2f GB/s", ref);
    return std::string(s);
  };
  std::printf("\nReferences in the same run (%s): memcpy %s, plain TCP stream on loopback %s\n",
              human(bytes).c_str(), gbps(memcpy_ref).c_str(), gbps(tcp_ref).c_str());
  for (const auto& f : figs) {
    if (!f.from_device.starts_with("cpu") || !f.to_device.starts_with("cpu")) continue;  // GPU references: hmc-gpu-ref
    double ref = f.provider == "shm" ? memcpy_ref : f.provider == "tcp" ? tcp_ref : 0;
    if (ref > 0)
      std::printf("  %d->%d %s: %.0f%% of %s\n", f.from, f.to, f.provider.c_str(), 100 * f.bandwidth_gbps / ref,
                  f.provider == "shm" ? "memcpy" : "the plain TCP stream");
  }
}

nlohmann::json matrix_json(int size, const std::vector<PairFigures>& figs, const MeasureOptions& opt, double memcpy_ref,
                           double tcp_ref) {
  nlohmann::json j = {{"ranks", size}, {"bytes", opt.bytes}, {"bandwidth_of", opt.put ? (opt.notify ? "put+notify" : "put") : "send/recv"},
                      {"rotate", opt.rotate},
                      {"latency_wait", opt.lat_poll ? "poll" : "wait"}, {"latency_round_trips", opt.lat_iters},
                      {"latency_warmup", opt.lat_warmup},
                      {"reference", {{"memcpy_gbps", memcpy_ref}, {"tcp_stream_gbps", tcp_ref}}}};
  j["pairs"] = nlohmann::json::array();
  for (const auto& f : figs)
    j["pairs"].push_back({{"from", f.from}, {"to", f.to}, {"provider", f.provider}, {"reason", f.reason},
                          {"peer_host", f.peer_host}, {"from_device", f.from_device}, {"to_device", f.to_device},
                          {"device_path", f.device_path}, {"bandwidth_gbps", f.bandwidth_gbps},
                          {"latency_us", f.latency_us}, {"poll_ns", f.poll_ns}, {"eager_limit", f.eager_limit},
                          {"get_limit", f.get_limit}, {"get_from", f.get_from}, {"eager_window", f.eager_window},
                          {"credit_wait_us", f.credit_wait_us}, {"split_from", f.split_from},
                          {"turns_from", f.turns_from}});
  return j;
}

}  // namespace hmc::probe
