// The collectives hmc-bench measures: names, buffer layouts and bus factors as nccl-tests
// defines them, and the call into hmc/collectives.h.
#include <algorithm>
#include <array>

#include "bench.h"
#include "hmc/collectives.h"

namespace hmc::bench {
namespace {

constexpr std::array<const char*, 10> kNames = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                                                "all_to_all", "gather",     "scatter",        "sendrecv",  "barrier"};

}  // namespace

const char* coll_name(Coll c) { return kNames[static_cast<int>(c)]; }

const std::vector<std::string>& coll_names() {
  static const std::vector<std::string> kAll(kNames.begin(), kNames.end());
  return kAll;
}

std::optional<Coll> parse_coll(const std::string& name) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (name == kNames[i]) return static_cast<Coll>(i);
  return std::nullopt;
}

CollTraits traits(Coll c) {
  switch (c) {
    case Coll::kAllReduce: case Coll::kReduceScatter: return {true, false, true, true};
    case Coll::kReduce: return {true, true, true, true};
    case Coll::kBroadcast: return {false, true, false, true};  // HMC's broadcast is in-place only
    case Coll::kGather: case Coll::kScatter: return {false, true, true, true};
    case Coll::kSendRecv: return {false, false, true, false};  // one buffer both ways would race
    case Coll::kBarrier: return {false, false, true, false};
    default: return {false, false, true, true};
  }
}

// nccl-tests' *GetCollByteCount and *GetBw: `bytes` is the size a row is labelled with;
// collectives that split it over ranks take bytes / (elem_size x n) per rank.
Layout layout(Coll c, std::size_t bytes, std::size_t elem_size, int n) {
  const std::size_t total = bytes / elem_size, per_rank = total / n;
  const double spread = n > 1 ? static_cast<double>(n - 1) / n : 0;
  Layout l;
  switch (c) {
    case Coll::kAllReduce: l = {total, total, total, 0, 0, 0, 2 * spread}; break;
    case Coll::kBroadcast: case Coll::kReduce: case Coll::kSendRecv: l = {total, total, total, 0, 0, 0, 1}; break;
    case Coll::kAllGather: case Coll::kGather: l = {per_rank, per_rank, per_rank * n, per_rank, 0, 0, spread}; break;
    case Coll::kReduceScatter: case Coll::kScatter: l = {per_rank, per_rank * n, per_rank, 0, per_rank, 0, spread}; break;
    case Coll::kAllToAll: l = {per_rank, per_rank * n, per_rank * n, 0, 0, 0, spread}; break;
    case Coll::kBarrier: l = {0, 0, 0, 0, 0, 0, 0}; break;
  }
  l.bytes = std::max(l.send_elems, l.recv_elems) * elem_size;
  return l;
}

Request launch(Coll c, Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
               ReduceOp op, int root, const CollOptions& opt) {
  switch (c) {
    case Coll::kAllReduce: return all_reduce(comm, send, recv, count, dtype, op, opt);
    case Coll::kAllGather: return all_gather(comm, send, recv, count, dtype, opt);
    case Coll::kReduceScatter: return reduce_scatter(comm, send, recv, count, dtype, op, opt);
    case Coll::kBroadcast: return broadcast(comm, recv, count, dtype, root, opt);
    case Coll::kReduce: return reduce(comm, send, recv, count, dtype, op, root, opt);
    case Coll::kAllToAll: return all_to_all(comm, send, recv, count, dtype, opt);
    case Coll::kGather: return gather(comm, send, recv, count, dtype, root, opt);
    case Coll::kScatter: return scatter(comm, send, recv, count, dtype, root, opt);
    case Coll::kSendRecv: {
      const int n = comm.size(), next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
      return Group(comm).send(send, count, dtype, next).recv(recv, count, dtype, prev).end(opt);
    }
    case Coll::kBarrier: return barrier(comm, opt);
  }
  return {};
}

}  // namespace hmc::bench
