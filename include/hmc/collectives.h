// Collectives on a Communicator: every one non-blocking (returns a Request); blocking
// forms are `op(...).wait()`. Where every rank has a vendor collective library
// (HMC_CCL=auto), the first call that could go to it starts a small exchange with the
// other ranks about it; the calls made until it ends wait in the communicator, and only a
// call given a stream waits for it in the call (up to HMC_TIMEOUT). Buffers are
// host memory or device memory (from Context::alloc, or elsewhere where the provider can
// say it is its own: context.h). In place is send == recv, except where a rank's own
// block sits inside a larger buffer: all_gather: send == recv + rank * count elements;
// gather (root): send == recv + root * count; reduce_scatter: recv == send + rank *
// recv_count; scatter (root): recv == send + root * count (docs/collectives.md). count 0
// is a no-op that still completes. Every rank must call the same collectives in the same
// order with matching arguments; CollOptions::check verifies that at a small cost.
// Collectives on one communicator may be in flight together. abort(), and destroying the
// communicator (which aborts it), fails every one still pending, those waiting for their
// stream or handed to a vendor library included: HMC's own at once with kAborted, and
// abort() returns once HMC's progress touches none of their buffers. A stream-ordered
// call's work already queued on its stream still runs there once its wait is released
// (with HMC_STREAM_STAGE, the copy of its staging back into the buffers): synchronize
// the stream before reusing them.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "hmc/communicator.h"
#include "hmc/request.h"
#include "hmc/types.h"

namespace hmc {

struct CollOptions {
  // Overrides HMC_ALGO for this call: "ring", "rd" (recursive doubling; recursive
  // halving for reduce_scatter, which takes "rhd" as the same), "rhd" (Rabenseifner
  // all_reduce), "tree" (binomial), "pairwise" / "linear" (all_to_all), "linear"
  // (gather, scatter), "dissemination" (barrier), "" = choose by size and rank count. A name the collective has no
  // algorithm for is kInvalidArgument; all_gather's and reduce_scatter's "rd" (and "rhd")
  // run as "ring" where the rank count is not a power of two.
  std::string algorithm;
  // Verify that all ranks called the same collective with the same count, dtype, op,
  // root and algorithm (and matching all_to_all_v counts) before any data moves, at the
  // cost of one small exchange; a mismatch fails every rank with kMismatch. A rank whose
  // own arguments are invalid fails alone at once, before the exchange; the others then
  // wait in it until HMC_TIMEOUT. Default: HMC_COLL_CHECK.
  std::optional<bool> check;
  // A stream of the buffers' device provider (a cudaStream_t for cuda), or null. With a
  // stream the collective starts after the work queued on it before the call, and work
  // queued on it after the call waits for the collective; the calling thread does not
  // block (the same contract as NCCL). HMC drives such collectives on a background
  // thread, so nobody needs to wait on the Request, which still reports errors. The
  // barrier, which has no buffer to order, takes no stream (kInvalidArgument).
  void* stream = nullptr;
};

Request all_reduce(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                   ReduceOp op, const CollOptions& opt = {});
// recv is used (and may be null) on the root only.
Request reduce(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
               ReduceOp op, int root, const CollOptions& opt = {});
Request broadcast(Communicator& comm, void* buf, std::size_t count, DataType dtype, int root,
                  const CollOptions& opt = {});
// recv holds size * count elements, rank r's block at r * count.
Request all_gather(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                   const CollOptions& opt = {});
// send holds size * recv_count elements; rank r receives the reduction of block r.
Request reduce_scatter(Communicator& comm, const void* send, void* recv, std::size_t recv_count,
                       DataType dtype, ReduceOp op, const CollOptions& opt = {});
// gather: the root's recv holds size * count elements; scatter: the root's send does.
Request gather(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, int root,
               const CollOptions& opt = {});
Request scatter(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype, int root,
                const CollOptions& opt = {});
// send and recv hold size * count elements; block j of send goes to rank j.
Request all_to_all(Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                   const CollOptions& opt = {});
// Counts and displacements in elements, one per rank.
Request all_to_all_v(Communicator& comm, const void* send, const std::vector<std::size_t>& send_counts,
                     const std::vector<std::size_t>& send_displs, void* recv,
                     const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs,
                     DataType dtype, const CollOptions& opt = {});
Request barrier(Communicator& comm, const CollOptions& opt = {});

// Grouped point-to-point: the sends and receives added with send() and recv() are issued
// together by end() and complete together through the Request it returns.
class Group {
 public:
  explicit Group(Communicator& comm) : comm_(comm) {}
  Group& send(const void* buf, std::size_t count, DataType dtype, int peer);
  Group& recv(void* buf, std::size_t count, DataType dtype, int peer);
  // opt.stream orders the group on a device stream (CollOptions::stream).
  Request end(const CollOptions& opt = {});

 private:
  struct Item {
    bool is_send;
    void* buf;
    std::size_t bytes;
    int peer;
  };
  Group& add(bool is_send, void* buf, std::size_t count, DataType dtype, int peer);
  Communicator& comm_;
  std::vector<Item> items_;
  Status error_;  // the first bad argument, reported by end()
};

// A sub-communicator of the ranks that passed the same color, ordered by (key, rank).
// A negative color returns an empty Communicator (the rank joins none). Every rank of
// `comm` calls it; `ctx` is the context `comm` was created with (Communicator::create
// needs the public Context, which a Communicator does not keep).
Result<Communicator> split(Context& ctx, Communicator& comm, int color, int key);

}  // namespace hmc
