// The public collectives of include/hmc/collectives.h: argument checks and the choice of
// builder; Call (call.cpp) does the rest.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/call.h"

namespace hmc {
namespace {

using coll::Algo;
using coll::Call;
using coll::CollKind;
using coll::Plan;

#define HMC_COLL_REQUIRE(kind, expr)                                                                   \
  do {                                                                                                 \
    ::hmc::Status hmc_s_ = (expr);                                                                     \
    if (!hmc_s_.ok())                                                                                  \
      return coll::failed_request(                                                                     \
          ::hmc::Status(hmc_s_.code(), std::string(coll::coll_kind_name(kind)) + ": " + hmc_s_.message())); \
  } while (0)

Status check_reduction(DataType dtype, ReduceOp op, std::size_t count, std::size_t factor) {
  HMC_RETURN_IF_ERROR(coll::check_dtype(dtype));
  HMC_RETURN_IF_ERROR(coll::check_op(op));
  return coll::check_fits(count, factor, dtype);
}

Status check_movement(DataType dtype, std::size_t count, std::size_t factor) {
  HMC_RETURN_IF_ERROR(coll::check_dtype(dtype));
  return coll::check_fits(count, factor, dtype);
}

const uint8_t* offset(const void* p, std::size_t bytes) { return static_cast<const uint8_t*>(p) + bytes; }

}  // namespace

Request all_reduce(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                   const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kAllReduce;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_reduction(dtype, op, count, 1));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
  HMC_COLL_REQUIRE(kKind, coll::check_aligned(send, dtype, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_aligned(recv, dtype, "recv"));
  const std::size_t bytes = count * dtype_size(dtype);
  if (send != recv) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, bytes, recv, bytes));
  c.dtype = dtype;
  c.op = op;
  c.count = count;
  c.algo_bytes = c.result_bytes = bytes;
  c.empty = count == 0;
  c.where = recv;
  c.ccl = coll::CclWork{kKind, send, recv, bytes, bytes, count, dtype, op, 0, bytes};
  return c.run([=](Plan& p, Algo a) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    switch (a) {
      case Algo::kRd: return coll::all_reduce_rd(p, send, recv, count);
      case Algo::kRhd: return coll::all_reduce_rhd(p, send, recv, count);
      case Algo::kTree: {
        auto reduced = coll::reduce_tree(p, send, recv, count, 0, false, coll::kNoAction, 0);
        if (!reduced) return reduced.status();
        return coll::broadcast_tree(p, recv, count, 0, false, reduced.value(), 1).status();
      }
      default: return coll::all_reduce_ring(p, send, recv, count);
    }
  });
}

Request reduce(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
               int root, const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kReduce;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_reduction(dtype, op, count, 1));
  HMC_COLL_REQUIRE(kKind, coll::check_root(root, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_aligned(send, dtype, "send"));
  const std::size_t bytes = count * dtype_size(dtype);
  if (c.rank() == root) {  // recv matters at the root only
    HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
    HMC_COLL_REQUIRE(kKind, coll::check_aligned(recv, dtype, "recv"));
    if (send != recv) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, bytes, recv, bytes));
  }
  c.dtype = dtype;
  c.op = op;
  c.count = count;
  c.root = root;
  c.algo_bytes = bytes;
  c.result_bytes = c.rank() == root ? bytes : 0;
  c.empty = count == 0;
  c.where = send;
  c.ccl = coll::CclWork{kKind, send, c.rank() == root ? recv : nullptr, bytes, c.result_bytes, count, dtype, op, root,
                        c.result_bytes};
  return c.run([=](Plan& p, Algo a) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    return coll::reduce_tree(p, send, recv, count, root, a == Algo::kRing, coll::kNoAction, 0).status();
  });
}

Request broadcast(Communicator& comm, void* buf, std::size_t count, DataType dtype, int root, const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kBroadcast;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_movement(dtype, count, 1));
  HMC_COLL_REQUIRE(kKind, coll::check_root(root, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(buf, count, "data"));
  c.dtype = dtype;
  c.count = count;
  c.root = root;
  c.algo_bytes = c.result_bytes = count * dtype_size(dtype);
  c.empty = count == 0;
  c.where = buf;
  c.ccl = coll::CclWork{kKind, buf, buf, c.result_bytes, c.result_bytes, count, dtype, std::nullopt, root, c.result_bytes};
  return c.run([=](Plan& p, Algo a) -> Status {
    if (p.size == 1) return {};
    return coll::broadcast_tree(p, buf, count, root, a == Algo::kRing, coll::kNoAction, 0).status();
  });
}

Request all_gather(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                   const CollOptions& opt) {
  return coll::all_gather_on(comm.size() ? &comm.impl() : nullptr, send, recv, count, dtype, opt);
}

Request coll::all_gather_on(core::CommImpl* ci, const void* send, void* recv, std::size_t count, DataType dtype,
                            const CollOptions& opt, std::optional<uint64_t> seq) {
  constexpr CollKind kKind = CollKind::kAllGather;
  Call c(ci, kKind, opt, seq);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_movement(dtype, count, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
  const std::size_t bytes = count * dtype_size(dtype), total = bytes * c.size();
  if (send != offset(recv, c.rank() * bytes))
    HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, bytes, recv, total));
  c.dtype = dtype;
  c.count = count;
  c.algo_bytes = c.result_bytes = total;
  c.empty = count == 0;
  c.where = recv;
  c.ccl = coll::CclWork{kKind, send, recv, bytes, total, count, dtype, std::nullopt, 0, total};
  return c.run([=](Plan& p, Algo a) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    if (a == Algo::kRd && coll::is_pow2(p.size)) return coll::all_gather_rd(p, send, recv, count);
    return coll::all_gather_ring(p, send, recv, count);
  });
}

Request reduce_scatter(Communicator& comm, const void* send, void* recv, std::size_t recv_count, DataType dtype,
                       ReduceOp op, const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kReduceScatter;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_reduction(dtype, op, recv_count, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, recv_count, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, recv_count, "recv"));
  HMC_COLL_REQUIRE(kKind, coll::check_aligned(send, dtype, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_aligned(recv, dtype, "recv"));
  const std::size_t bytes = recv_count * dtype_size(dtype), total = bytes * c.size();
  if (recv != offset(send, c.rank() * bytes))
    HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, total, recv, bytes));
  c.dtype = dtype;
  c.op = op;
  c.count = recv_count;
  c.algo_bytes = total;
  c.result_bytes = bytes;
  c.empty = recv_count == 0;
  c.where = recv;
  c.ccl = coll::CclWork{kKind, send, recv, total, bytes, recv_count, dtype, op, 0, bytes};
  return c.run([=](Plan& p, Algo a) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    if ((a == Algo::kRd || a == Algo::kRhd) && coll::is_pow2(p.size))
      return coll::reduce_scatter_rh(p, send, recv, recv_count);
    return coll::reduce_scatter_ring(p, send, recv, recv_count);
  });
}

Request gather(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, int root,
               const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kGather;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_movement(dtype, count, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_root(root, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
  const std::size_t bytes = count * dtype_size(dtype), total = bytes * c.size();
  if (c.rank() == root) {
    HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
    if (send != offset(recv, root * bytes)) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, bytes, recv, total));
  }
  c.dtype = dtype;
  c.count = count;
  c.root = root;
  c.algo_bytes = bytes;
  c.result_bytes = c.rank() == root ? total : 0;
  c.empty = count == 0;
  c.where = send;
  if (opt.stream) {
    c.in = {{send, bytes}};
    if (c.rank() == root) c.out = {{recv, total}};
  }
  return c.run([=](Plan& p, Algo) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    return coll::gather_linear(p, send, recv, count, root);
  });
}

Request scatter(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, int root,
                const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kScatter;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_movement(dtype, count, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_root(root, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
  const std::size_t bytes = count * dtype_size(dtype), total = bytes * c.size();
  if (c.rank() == root) {
    HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
    if (recv != offset(send, root * bytes)) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, total, recv, bytes));
  }
  c.dtype = dtype;
  c.count = count;
  c.root = root;
  c.algo_bytes = c.result_bytes = bytes;
  c.empty = count == 0;
  c.where = recv;
  if (opt.stream) {
    if (c.rank() == root) c.in = {{send, total}};
    c.out = {{recv, bytes}};
  }
  return c.run([=](Plan& p, Algo) -> Status {
    if (p.size == 1) {
      p.s.copy(recv, send, bytes);
      return {};
    }
    return coll::scatter_linear(p, send, recv, count, root);
  });
}

Request all_to_all(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                   const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kAllToAll;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  HMC_COLL_REQUIRE(kKind, check_movement(dtype, count, c.size()));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, count, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, count, "recv"));
  const std::size_t bytes = count * dtype_size(dtype), total = bytes * c.size();
  if (send != recv) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, total, recv, total));
  c.dtype = dtype;
  c.count = count;
  c.algo_bytes = bytes;
  c.result_bytes = total;
  c.empty = count == 0;
  c.where = recv;
  c.ccl = coll::CclWork{kKind, send, recv, total, total, count, dtype, std::nullopt, 0, total};
  return c.run([=](Plan& p, Algo a) -> Status {
    const int window = a == Algo::kPairwise ? 1 : p.size - 1;
    if (send == recv) return coll::all_to_all_in_place(p, recv, count, window);
    std::vector<std::size_t> counts(p.size, count), displs(p.size);
    for (int j = 0; j < p.size; ++j) displs[j] = j * count;
    return coll::all_to_all_v(p, send, counts, displs, recv, counts, displs, window);
  });
}

Request all_to_all_v(Communicator& comm, const void* send, const std::vector<std::size_t>& send_counts,
                     const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
                     const std::vector<std::size_t>& recv_displs, DataType dtype, const CollOptions& opt) {
  constexpr CollKind kKind = CollKind::kAllToAllV;
  Call c(comm, kKind, opt);
  if (!c.status().ok()) return c.run(nullptr);
  const int n = c.size(), r = c.rank();
  HMC_COLL_REQUIRE(kKind, coll::check_dtype(dtype));
  for (const auto* v : {&send_counts, &send_displs, &recv_counts, &recv_displs})
    if (v->size() != static_cast<std::size_t>(n))
      HMC_COLL_REQUIRE(kKind, Status(ErrorCode::kInvalidArgument, "counts and displacements need one entry per rank (" +
                                                                      std::to_string(n) + "), got " +
                                                                      std::to_string(v->size())));
  std::size_t sent = 0, got = 0;
  const std::size_t limit = SIZE_MAX / dtype_size(dtype);
  for (int j = 0; j < n; ++j) {
    if (send_counts[j] > limit || send_displs[j] > limit - send_counts[j] || recv_counts[j] > limit ||
        recv_displs[j] > limit - recv_counts[j])
      HMC_COLL_REQUIRE(kKind, Status(ErrorCode::kInvalidArgument, "count plus displacement of rank " + std::to_string(j) +
                                                                      " overflows the address space"));
    // Saturated: a sum that wrapped to 0 would let a null buffer through.
    sent = send_counts[j] > limit - sent ? limit : sent + send_counts[j];
    got = recv_counts[j] > limit - got ? limit : got + recv_counts[j];
  }
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(send, sent, "send"));
  HMC_COLL_REQUIRE(kKind, coll::check_buffer(recv, got, "recv"));
  if (send_counts[r] != recv_counts[r])
    HMC_COLL_REQUIRE(kKind, Status(ErrorCode::kInvalidArgument, "this rank sends itself " + std::to_string(send_counts[r]) +
                                                                    " elements but expects " + std::to_string(recv_counts[r])));
  const std::size_t esz = dtype_size(dtype);
  std::size_t send_end = 0, recv_end = 0;  // the extents the blocks span, in elements
  for (int j = 0; j < n; ++j) {
    if (send_counts[j]) send_end = std::max(send_end, send_displs[j] + send_counts[j]);
    if (recv_counts[j]) recv_end = std::max(recv_end, recv_displs[j] + recv_counts[j]);
  }
  if (send != recv) HMC_COLL_REQUIRE(kKind, coll::check_disjoint(send, send_end * esz, recv, recv_end * esz));
  // Two peers writing one stretch of recv would race: their blocks must not overlap.
  std::vector<int> by_displ;
  for (int j = 0; j < n; ++j)
    if (recv_counts[j]) by_displ.push_back(j);
  std::sort(by_displ.begin(), by_displ.end(), [&](int a, int b) { return recv_displs[a] < recv_displs[b]; });
  for (std::size_t i = 1; i < by_displ.size(); ++i) {
    const int prev = by_displ[i - 1], next = by_displ[i];
    if (recv_displs[next] < recv_displs[prev] + recv_counts[prev])
      HMC_COLL_REQUIRE(kKind, Status(ErrorCode::kInvalidArgument, "the receive blocks of ranks " + std::to_string(prev) +
                                                                      " and " + std::to_string(next) + " overlap"));
  }
  c.dtype = dtype;
  c.algo_bytes = sent * esz / n;
  c.result_bytes = got * esz;
  c.empty = sent == 0 && got == 0;
  c.where = recv;
  if (opt.stream) {
    c.in = {{send, send_end * esz}};
    c.out = {{recv, recv_end * esz}};
    // Blocks that leave gaps: staged, the gaps must come back as they were.
    if (got != recv_end) c.in.push_back({recv, recv_end * esz});
  }
  c.to_peer.assign(send_counts.begin(), send_counts.end());
  c.from_peer.assign(recv_counts.begin(), recv_counts.end());
  // By value: the call may run later, from the delegation's queue, after the caller's vectors are gone.
  return c.run([=](Plan& p, Algo a) -> Status {
    return coll::all_to_all_v(p, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                              a == Algo::kPairwise ? 1 : p.size - 1);
  });
}

Request barrier(Communicator& comm, const CollOptions& opt) {
  Call c(comm, CollKind::kBarrier, opt);
  if (!c.status().ok()) return c.run(nullptr);
  c.ccl = coll::CclWork{.kind = CollKind::kBarrier};  // no data: one round of the shared segments
  return c.run([](Plan& p, Algo) -> Status { return p.size == 1 ? Status{} : coll::barrier_dissemination(p); });
}

}  // namespace hmc
