// hmc-probe: what HMC sees on this machine, and how each peer pair is connected.
//
//   hmc-probe                  providers (with the reason when unavailable), devices, config
//   hmc-probe config           the configuration table
//   hmc-probe --local N        N ranks here: the path matrix with reasons and measured figures
//   --device cuda / cuda@0     ... with buffers on GPUs (GPU<->GPU), or rank 0 only (GPU<->CPU)
//   --put                      ... bandwidth of one-sided puts instead of send/recv
//   --put --notify             ... of puts that each carry a notification the target waits for
//   --lat-poll                 ... latency with Request::test polled back to back
//                              (every matrix also gives what one empty poll costs, "poll ns")
//   --lat-iters N --lat-warmup W  ... N timed latency round trips per pair after W untimed
//   --memory malloc            ... host buffers from the heap (default: Context::alloc kShareable)
//   --rotate                   ... the messages in flight each from and into a buffer of their own
//   --json                     machine-readable output
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/config.h"
#include "device_spec.h"
#include "local_ranks.h"
#include "probe.h"

using namespace hmc;

namespace {

int worker(const probe::MeasureOptions& opt, bool json) {
  auto ctx = Context::create();
  if (!ctx) return std::fprintf(stderr, "hmc-probe: %s\n", ctx.status().to_string().c_str()), 1;
  auto comm = Communicator::from_env(ctx.value());
  if (!comm) return std::fprintf(stderr, "hmc-probe: %s\n", comm.status().to_string().c_str()), 1;
  auto figs = probe::measure_all(ctx.value(), comm.value(), opt);
  if (!figs) return std::fprintf(stderr, "hmc-probe: rank %d: %s\n", comm->rank(), figs.status().to_string().c_str()), 1;
  if (comm->rank() == 0) {
    double mem = probe::memcpy_gbps(opt.bytes, opt.iters);
    double tcp = probe::tcp_stream_gbps(opt.bytes, opt.iters);
    if (json) std::cout << probe::matrix_json(comm->size(), figs.value(), opt, mem, tcp).dump(2) << "\n";
    else probe::print_matrix(comm->size(), figs.value(), opt, mem, tcp);
  }
  Status s = comm->finalize();
  return s.ok() ? 0 : (std::fprintf(stderr, "hmc-probe: finalize: %s\n", s.to_string().c_str()), 1);
}

}  // namespace

int main(int argc, char** argv) {
  hmc::tools::name_this_process(argv[0]);
  CLI::App app{"hmc-probe: HMC's providers, devices, configuration and paths"};
  int local = 0;
  bool json = false, rank_worker = false;
  std::string size_text = "64M";
  probe::MeasureOptions opt;
  int timeout_s = 300;
  app.add_option("--local", local, "start N ranks on this machine and print the path matrix (N >= 2: a matrix of pairs)")
      ->check(CLI::Range(2, 64));
  app.add_flag("--json", json, "print JSON");
  app.add_option("-b,--bytes", size_text, "message size for the bandwidth figure (e.g. 4M, 64M)")->capture_default_str();
  app.add_option("-n,--iters", opt.iters, "bandwidth iterations per pair")->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  app.add_option("--lat-iters", opt.lat_iters, "latency round trips per pair")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  app.add_option("--lat-warmup", opt.lat_warmup,
                 "untimed latency round trips per pair before the timed ones (ucx_perftest's -w: 10000)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))->capture_default_str();
  app.add_flag("--lat-poll", opt.lat_poll,
               "latency with Request::test polled back to back (as ucx_perftest polls) instead of Request::wait, "
               "which yields the CPU between polls");
  app.add_option("--timeout", timeout_s, "seconds before the local ranks are killed")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("-g,--device", opt.device,
                 "--local buffers on provider[:index][@ranks]: cuda = every rank on a GPU, cuda@0 = rank 0 on a GPU "
                 "and the others on cpu")->capture_default_str();
  app.add_option("-m,--memory", opt.memory,
                 "--local host buffers: shareable (Context::alloc kShareable), default (Context::alloc "
                 "kDefault) or malloc (the heap, as an application's own)")
      ->check(CLI::IsMember({"shareable", "default", "malloc"}))
      ->capture_default_str();
  app.add_flag("--put", opt.put,
               "--local bandwidth of one-sided puts (Communicator::put, 4 in flight, into the peer's registered "
               "buffer) instead of send/recv; host buffers only");
  app.add_flag("--notify", opt.notify,
               "with --put: every put carries a notification (its number), and the time runs until the target "
               "took the last one with Communicator::wait_notify");
  app.add_flag("--rotate", opt.rotate,
               "--local bandwidth with the 4 messages in flight going from and into 4 buffers in turn, as a "
               "pipeline's would (default: all from and into one buffer, as ucx_perftest and osu_bw do)");
  app.add_flag("--rank-worker", rank_worker, "internal: run as one rank from the environment")->group("");
  auto* config_cmd = app.add_subcommand("config", "print the configuration table");
  CLI11_PARSE(app, argc, argv);
  // The measuring options measure the pairs that --local starts: alone they would be ignored.
  if (!rank_worker && local == 0) {
    for (const char* name : {"-b", "-n", "--lat-iters", "--lat-warmup", "--lat-poll", "--timeout", "-g", "-m", "--put",
                             "--notify", "--rotate"}) {
      if (app.count(name) == 0) continue;
      std::fprintf(stderr, "hmc-probe: %s measures the pairs that --local N starts; add --local\n", name);
      return 2;
    }
  }
  if (*config_cmd && local > 0) {
    std::fprintf(stderr, "hmc-probe: config prints this machine's table; it does not go with --local\n");
    return 2;
  }
  auto bytes = core::parse_size(size_text);
  if (!bytes || *bytes == 0) {
    std::fprintf(stderr, "hmc-probe: bad size '%s' (use e.g. 64K, 4M)\n", size_text.c_str());
    return 2;
  }
  opt.bytes = *bytes;
  if (auto need = probe::buffer_bytes(opt); !need) {
    std::fprintf(stderr, "hmc-probe: %s\n", need.status().message().c_str());
    return 2;
  }
  if (opt.notify && !opt.put) {
    std::fprintf(stderr, "hmc-probe: --notify goes with --put\n");
    return 2;
  }
  auto spec = tools::parse_device_spec(opt.device);
  // With --local the ranks are known here: a rank list beyond them is refused before any
  // starts (a rank from the environment checks it again in pick_device).
  if (Status s = !spec ? spec.status() : local > 0 ? tools::check_ranks(spec.value(), local) : Status(); !s.ok()) {
    std::fprintf(stderr, "hmc-probe: %s\n", s.message().c_str());
    return 2;
  }
  if (opt.put && spec->provider != "cpu") {
    std::fprintf(stderr, "hmc-probe: --put measures host buffers only (a put into device memory needs a net "
                         "provider that touches it)\n");
    return 2;
  }

  if (rank_worker) return worker(opt, json);
  if (local > 0) {
    std::vector<std::string> args = {"--rank-worker", "-b", std::to_string(opt.bytes), "-n", std::to_string(opt.iters),
                                     "--lat-iters", std::to_string(opt.lat_iters), "--lat-warmup",
                                     std::to_string(opt.lat_warmup), "-g", opt.device};
    if (json) args.push_back("--json");
    if (opt.put) args.push_back("--put");
    if (opt.notify) args.push_back("--notify");
    if (opt.lat_poll) args.push_back("--lat-poll");
    if (opt.rotate) args.push_back("--rotate");
    args.insert(args.end(), {"-m", opt.memory});
    return tools::run_local_ranks("hmc-probe", local, args, timeout_s);
  }
  auto ctx = Context::create();
  if (!ctx) {
    std::fprintf(stderr, "hmc-probe: %s\n", ctx.status().to_string().c_str());
    return 1;
  }
  if (json) {
    nlohmann::json j;  // `config`: the configuration table only
    if (!*config_cmd) j["providers"] = probe::providers_json(ctx.value());
    j["config"] = nlohmann::json::array();
    for (const auto& e : ctx->config())
      j["config"].push_back({{"name", e.name}, {"type", e.type}, {"default", e.default_value}, {"value", e.value},
                             {"source", e.source}, {"help", e.help}});
    if (*config_cmd) return std::cout << j.dump(2) << "\n", 0;
    j["devices"] = nlohmann::json::array();
    for (const auto& d : ctx->devices())
      j["devices"].push_back({{"id", d.id.to_string()}, {"vendor", d.vendor}, {"model", d.model},
                              {"pci_bus_id", d.pci_bus_id}, {"numa_node", d.numa_node}, {"memory_bytes", d.memory_bytes}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (*config_cmd) probe::print_config(ctx.value());
  else probe::print_overview(ctx.value());
  return 0;
}
