// hmc-p2p-check: one rank of a point-to-point check, initialised from the environment
// (HMC_RANK/HMC_WORLD_SIZE/HMC_ROOT/HMC_SECRET, torchrun or mpirun variables). Every rank
// exchanges random data of several sizes with every other rank and checks it, then splits
// the communicator (ranks in reverse order) and sums the ranks over it: the split's own
// bootstrap must be reachable from every host. P2P_CHECK_ROUNDS=N does it all N times in
// one process and context, each with a new from_env communicator on the same root address.
// Used by the network-namespace and launcher tests; exits 0 when all data arrived intact.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "hmc/hmc.h"

namespace {

std::vector<uint8_t> pattern(std::size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 g(seed);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

int fail(const char* what, const hmc::Status& s) {
  std::fprintf(stderr, "hmc-p2p-check: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

int check(hmc::Context& ctx) {
  auto comm = hmc::Communicator::from_env(ctx);
  if (!comm) return fail("communicator", comm.status());
  int rank = comm->rank(), size = comm->size();
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const auto& path = comm->path(peer);
    std::printf("rank %d -> rank %d on %s: %s (%s)\n", rank, peer, comm->peer(peer).hostname.c_str(),
                path.provider.c_str(), path.reason.c_str());
    for (std::size_t n : {std::size_t(0), std::size_t(100), std::size_t(1) << 20, std::size_t(64) << 20}) {
      auto out = pattern(n, rank * 1000 + peer * 10 + n);
      std::vector<uint8_t> in(n, 0xCC);
      hmc::Request s = comm->isend(out.data(), n, peer, 3);
      hmc::Request r = comm->irecv(in.data(), n, peer, 3);
      if (auto st = s.wait(); !st.ok()) return fail("send", st);
      if (auto st = r.wait(); !st.ok()) return fail("recv", st);
      if (in != pattern(n, peer * 1000 + rank * 10 + n)) {
        std::fprintf(stderr, "hmc-p2p-check: wrong data from rank %d (%zu bytes)\n", peer, n);
        return 1;
      }
    }
  }
  auto sub = hmc::split(ctx, comm.value(), 0, -rank);
  if (!sub) return fail("split", sub.status());
  int64_t mine = rank, sum = -1;
  if (auto st = hmc::all_reduce(sub.value(), &mine, &sum, 1, hmc::DataType::kInt64, hmc::ReduceOp::kSum).wait(); !st.ok())
    return fail("all_reduce over the split", st);
  if (sub->rank() != size - 1 - rank || sum != int64_t{size} * (size - 1) / 2) {
    std::fprintf(stderr, "hmc-p2p-check: split: rank %d of %d, sum %lld\n", sub->rank(), sub->size(), static_cast<long long>(sum));
    return 1;
  }
  if (auto st = sub->finalize(); !st.ok()) return fail("finalize the split", st);
  if (auto st = comm->finalize(); !st.ok()) return fail("finalize", st);
  std::printf("rank %d: all data checked\n", rank);
  return 0;
}

}  // namespace

int main() {
  auto ctx = hmc::Context::create();
  if (!ctx) return fail("context", ctx.status());
  const char* rounds = std::getenv("P2P_CHECK_ROUNDS");
  for (int n = rounds ? std::atoi(rounds) : 1, i = 0; i < n; ++i)
    if (int rc = check(ctx.value())) return rc;
  return 0;
}
