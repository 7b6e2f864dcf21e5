// hmc-bench: nccl-tests for HMC. One collective per run, a size sweep, a table on rank 0.
//
//   hmc-bench all_reduce -b 8 -e 64M -f 4 --local 4     4 ranks on this machine
//   mpirun -np 8 -x HMC_ROOT=host:port hmc-bench ...    one rank per process (also torchrun)
//   hmc-bench all_reduce                               no launcher: a single rank
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "local_ranks.h"

using namespace hmc;
using namespace hmc::bench;

namespace {

std::string setting(const Context& ctx, const std::string& name) {
  for (const auto& e : ctx.config())
    if (e.name == name) return e.value;
  return {};
}

// Ranks from the environment (--local's children, mpirun, torchrun); a process that no
// launcher started runs as a world of one.
Result<Communicator> join(Context& ctx) {
  if (setting(ctx, "HMC_RANK").empty() && setting(ctx, "RANK").empty() && setting(ctx, "OMPI_COMM_WORLD_RANK").empty()) {
    auto id = ctx.create_unique_id();
    if (!id) return id.status();
    return Communicator::create(ctx, id.value(), 0, 1);
  }
  return Communicator::from_env(ctx);
}

// "cuda:1" as given; "cuda" = rank % the number of such devices this process sees.
Result<DeviceId> pick_device(const Context& ctx, const std::string& spec, int rank) {
  auto colon = spec.find(':');
  std::string provider = spec.substr(0, colon);
  int count = 0;
  for (const auto& d : ctx.devices()) count += d.id.provider == provider;
  if (count == 0) return Status(ErrorCode::kNotFound, "no device of provider '" + provider + "' (see hmc-probe)");
  if (colon == std::string::npos) return DeviceId{provider, rank % count};
  char* end = nullptr;
  long index = std::strtol(spec.c_str() + colon + 1, &end, 10);
  if (*end || index < 0 || index >= count)
    return Status(ErrorCode::kInvalidArgument, "device '" + spec + "': index outside [0, " + std::to_string(count) + ")");
  return DeviceId{provider, static_cast<int>(index)};
}

int fail(const char* what, int rank, const Status& s) {
  if (rank < 0) std::fprintf(stderr, "hmc-bench: %s: %s\n", what, s.to_string().c_str());
  else std::fprintf(stderr, "hmc-bench: rank %d: %s: %s\n", rank, what, s.to_string().c_str());
  return 1;
}

int run_rank(const Options& opt) {
  auto ctx = Context::create();
  if (!ctx) return fail("context", -1, ctx.status());
  auto comm = join(ctx.value());
  if (!comm) return fail("communicator", -1, comm.status());
  const int rank = comm->rank(), size = comm->size();
  if (traits(opt.coll).rooted && opt.root >= size)
    return fail("arguments", rank, {ErrorCode::kInvalidArgument, "root " + std::to_string(opt.root) + " >= " + std::to_string(size) + " ranks"});
  auto device = pick_device(ctx.value(), opt.device, rank);
  if (!device) return fail("device", rank, device.status());

  RunInfo info{size, opt.device + " (" + memory_name(opt.memory) + " memory)", {}};
  for (int r = 0; r < size; ++r) {
    const PeerInfo& p = comm->peer(r);
    char line[256];
    std::snprintf(line, sizeof line, "Rank %3d Pid %7d on %12s device %s", r, p.pid, p.hostname.c_str(),
                  r == rank ? device->to_string().c_str() : opt.device.c_str());
    info.rank_lines.push_back(line);
  }
  Report report(opt, info);
  if (rank == 0) report.header();
  auto rows = run_sweep(ctx.value(), comm.value(), device.value(), opt, report);
  if (!rows) {
    comm->abort();
    return fail("sweep", rank, rows.status());
  }
  uint64_t wrong = rank == 0 ? report.footer(rows.value()) : 0;
  if (Status s = comm->finalize(); !s.ok()) return fail("finalize", rank, s);
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli;
  if (int rc = parse_cli(argc, argv, cli); rc >= 0) return rc;
  if (cli.local > 0) return hmc::tools::run_local_ranks("hmc-bench", cli.local, worker_args(cli.opt), cli.timeout_s);
  return run_rank(cli.opt);
}
