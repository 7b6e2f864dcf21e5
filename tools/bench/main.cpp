// hmc-bench: nccl-tests for HMC. One collective per run, a size sweep, a table on rank 0.
//
//   hmc-bench all_reduce -b 8 -e 64M -f 4 --local 4     4 ranks on this machine
//   mpirun -np 8 -x HMC_ROOT=host:port hmc-bench ...    one rank per process (also torchrun)
//   hmc-bench all_reduce                               no launcher: a single rank
//   hmc-bench all_reduce --device cuda@0,1 --local 4   ranks 0, 1 on GPUs, 2, 3 on host memory
#include <cstdio>

#include "cli.h"
#include "device_spec.h"
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

// Each rank's device ("cuda:1") to rank 0, for the header; outside the timed part.
Result<std::vector<std::string>> gather_devices(Communicator& comm, const DeviceId& mine) {
  constexpr uint64_t kDeviceTag = 0x62656e6369;  // next to sweep.cpp's result tag
  std::vector<std::string> all(comm.size());
  char name[64] = {};
  std::snprintf(name, sizeof name, "%s", mine.to_string().c_str());
  if (comm.rank() != 0) {
    HMC_RETURN_IF_ERROR(comm.send(name, sizeof name, 0, kDeviceTag));
    return all;
  }
  all[0] = name;
  for (int r = 1; r < comm.size(); ++r) {
    HMC_RETURN_IF_ERROR(comm.recv(name, sizeof name, r, kDeviceTag));
    name[sizeof name - 1] = 0;
    all[r] = name;
  }
  return all;
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
  auto spec = tools::parse_device_spec(opt.device);
  if (!spec) return fail("arguments", rank, spec.status());
  auto device = tools::pick_device(ctx.value(), comm.value(), spec.value());
  if (!device) {
    comm->abort();
    return fail("device", rank, device.status());
  }
  auto devices = gather_devices(comm.value(), device.value());
  if (!devices) return fail("devices", rank, devices.status());

  RunInfo info{size, opt.device + " (" + memory_name(opt.memory) + " memory" + (opt.stream ? ", stream-ordered" : "") + ")", {}};
  for (int r = 0; r < size; ++r) {
    const PeerInfo& p = comm->peer(r);
    char line[256];
    std::snprintf(line, sizeof line, "Rank %3d Pid %7d on %12s device %s", r, p.pid, p.hostname.c_str(),
                  devices.value()[r].c_str());
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
  hmc::tools::name_this_process(argv[0]);
  Cli cli;
  if (int rc = parse_cli(argc, argv, cli); rc >= 0) return rc;
  if (cli.local > 0) return hmc::tools::run_local_ranks("hmc-bench", cli.local, worker_args(cli.opt), cli.timeout_s);
  return run_rank(cli.opt);
}
