// Command line: nccl-tests' short and long flags, sizes as 8, 64K, 4M, 1G.
#include "cli.h"

#include <cstdio>

#include <CLI/CLI.hpp>

#include "core/config.h"
#include "device_spec.h"

namespace hmc::bench {
namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

bool parse_bytes(const std::string& flag, const std::string& text, std::size_t& out) {
  auto v = core::parse_size(text);
  if (!v || *v == 0) {
    std::fprintf(stderr, "hmc-bench: %s: bad size '%s' (use e.g. 8, 64K, 4M, 1G)\n", flag.c_str(), text.c_str());
    return false;
  }
  out = *v;
  return true;
}

bool parse_dtypes(const std::vector<std::string>& names, std::vector<DataType>& out) {
  out.clear();
  for (const auto& n : names) {
    if (n == "all") {
      for (int t = 0; t < kNumDataTypes; ++t) out.push_back(static_cast<DataType>(t));
      continue;
    }
    auto t = parse_dtype(n);
    if (!t) return std::fprintf(stderr, "hmc-bench: unknown dtype '%s'\n", n.c_str()), false;
    out.push_back(*t);
  }
  return !out.empty();
}

bool parse_ops(const std::vector<std::string>& names, std::vector<ReduceOp>& out) {
  out.clear();
  for (const auto& n : names) {
    if (n == "all") {
      for (int o = 0; o < kNumReduceOps; ++o) out.push_back(static_cast<ReduceOp>(o));
      continue;
    }
    auto o = parse_op(n);
    if (!o) return std::fprintf(stderr, "hmc-bench: unknown op '%s'\n", n.c_str()), false;
    out.push_back(*o);
  }
  return !out.empty();
}

}  // namespace

const char* memory_name(AllocKind k) {
  return k == AllocKind::kPinnedHost ? "pinned" : k == AllocKind::kShareable ? "shareable" : "default";
}

int parse_cli(int argc, char** argv, Cli& cli) {
  Options& o = cli.opt;
  CLI::App app{"hmc-bench: HMC collective performance, nccl-tests style.\n"
               "  hmc-bench all_reduce -b 8 -e 64M -f 4 --local 4\n"
               "  mpirun -np 4 -x HMC_ROOT=host:port hmc-bench all_gather -b 1M -e 1G -f 2"};
  std::string coll = "all_reduce", min_b = "32M", max_b = "32M";
  std::vector<std::string> dtypes = {"float32"}, ops = {"sum"};
  int aggregate = 3;
  bool json = false, csv = false;
  app.add_option("collective", coll, "what to measure")->check(CLI::IsMember(coll_names()))->required();
  app.add_option("-b,--minbytes", min_b, "smallest size, bytes (8, 64K, 4M, 1G)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size, bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "size multiplication factor")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1 << 30))->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations before each size")->check(CLI::Range(0, 1 << 30))->capture_default_str();
  app.add_option("-z,--blocking", o.blocking,
                 "1: wait for each timed call before the next; 0: issue them back to back and wait at the end "
                 "(nccl-tests' default)")->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("-c,--check", o.check, "verify results on known data once per size and form (0 = off)")->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("-d,--datatype", dtypes, "int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double, or all")
      ->delimiter(',')->capture_default_str();
  app.add_option("-o,--op", ops, "sum prod min max avg, or all (reducing collectives)")->delimiter(',')->capture_default_str();
  app.add_option("-r,--root", o.root, "root rank of broadcast, reduce, gather, scatter")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("-a,--average", aggregate, "time over ranks: 0 rank 0, 1 avg, 2 min, 3 max")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("-g,--device", o.device,
                 "buffers on provider[:index][@ranks]: cuda = each rank on a GPU (local rank % GPUs), cuda:1 = GPU 1, "
                 "cuda@0,1 or cuda@0-1 = ranks 0 and 1 on GPUs and the other ranks on cpu")->capture_default_str();
  std::string memory = "default";
  app.add_option("-m,--memory", memory, "buffers as Context::alloc makes them")
      ->check(CLI::IsMember({"default", "pinned", "shareable"}))->capture_default_str();
  app.add_flag("--stream", o.stream,
               "stream-ordered: ranks with device buffers call on a device stream (CollOptions::stream), "
               "timed as nccl-tests times (calls queued, then the stream drained); ranks on cpu call without; not for barrier");
  auto* local_opt = app.add_option("--local", cli.local, "start N ranks on this machine")->check(CLI::Range(1, 256));
  // Without --local no rank of this program's is killed: ignored, it would mislead.
  app.add_option("--timeout", cli.timeout_s, "seconds before --local ranks are killed")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str()->needs(local_opt);
  auto* json_flag = app.add_flag("--json", json, "print one JSON document instead of the table");
  app.add_flag("--csv", csv, "print CSV instead of the table")->excludes(json_flag);
  app.add_flag("--progress", o.progress, "progress line on stderr even when it is not a terminal");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.coll = *parse_coll(coll);
  if (!parse_bytes("-b", min_b, o.min_bytes) || !parse_bytes("-e", max_b, o.max_bytes)) return 2;
  if (o.min_bytes > o.max_bytes) {
    std::fprintf(stderr, "hmc-bench: -b %zu is larger than -e %zu\n", o.min_bytes, o.max_bytes);
    return 2;
  }
  auto spec = tools::parse_device_spec(o.device);
  // With --local the ranks are known here: a rank list beyond them is refused before any
  // starts (a rank from a launcher checks it again in pick_device).
  if (Status st = !spec ? spec.status() : cli.local > 0 ? tools::check_ranks(spec.value(), cli.local) : Status();
      !st.ok()) {
    std::fprintf(stderr, "hmc-bench: %s\n", st.message().c_str());
    return 2;
  }
  if (o.stream && o.coll == Coll::kBarrier) {
    std::fprintf(stderr, "hmc-bench: --stream: a barrier has no buffer to tell which device its stream is on\n");
    return 2;
  }
  if (o.stream && spec->provider == "cpu") {
    std::fprintf(stderr, "hmc-bench: --stream needs buffers on a device (-g cuda, -g cuda@0,1): cpu has no streams\n");
    return 2;
  }
  if (!parse_dtypes(dtypes, o.dtypes) || !parse_ops(ops, o.ops)) return 2;
  o.aggregate = static_cast<Aggregate>(aggregate);
  o.memory = memory == "pinned" ? AllocKind::kPinnedHost : memory == "shareable" ? AllocKind::kShareable : AllocKind::kDefault;
  o.format = json ? Options::Format::kJson : csv ? Options::Format::kCsv : Options::Format::kTable;
  return -1;
}

std::vector<std::string> worker_args(const Options& o) {
  std::vector<std::string> dtypes, ops;
  for (DataType t : o.dtypes) dtypes.push_back(dtype_name(t));
  for (ReduceOp op : o.ops) ops.push_back(op_name(op));
  std::vector<std::string> a = {coll_name(o.coll), "-b", std::to_string(o.min_bytes),
                                "-e", std::to_string(o.max_bytes), "-f", std::to_string(o.factor),
                                "-n", std::to_string(o.iters), "-w", std::to_string(o.warmup),
                                "-c", std::to_string(o.check), "-z", std::to_string(o.blocking),
                                "-d", join(dtypes), "-o", join(ops),
                                "-r", std::to_string(o.root), "-a", std::to_string(static_cast<int>(o.aggregate)),
                                "-g", o.device, "-m", memory_name(o.memory)};
  if (o.format == Options::Format::kJson) a.push_back("--json");
  if (o.format == Options::Format::kCsv) a.push_back("--csv");
  if (o.progress) a.push_back("--progress");
  if (o.stream) a.push_back("--stream");
  return a;
}

}  // namespace hmc::bench
