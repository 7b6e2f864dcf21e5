// Call: the common path of every public collective — sequence number, argument checks,
// algorithm choice, schedule, launch.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "collectives/ccl.h"
#include "collectives/plan.h"
#include "collectives/select.h"
#include "collectives/stream_stage.h"
#include "core/stream_order.h"
#include "hmc/collectives.h"

namespace hmc::coll {

struct CommState;  // comm_state.h
Request failed_request(Status s);
// The stream binding of an operation on `where`'s device, or null without a stream;
// `copies` are queued around its wait (stream_stage.h).
Result<std::shared_ptr<core::StreamOrder>> stream_order(core::ContextImpl& ctx, const void* where, void* stream,
                                                        core::StreamCopies copies = {});
// The host staging of a call on `stream` (none without one, or with HMC_STREAM_STAGE=0).
Result<StreamStage> stage_for(core::ContextImpl& ctx, const CommState& state, void* stream, const void* where,
                              const std::vector<Extent>& in, const std::vector<Extent>& out);

class Call {
 public:
  // Takes the communicator's next sequence number, even when the call then fails its
  // argument checks, so that later collectives keep matching tags on every rank.
  Call(Communicator& comm, CollKind kind, const CollOptions& opt);
  // The same on the communicator's implementation (null: an empty communicator), with
  // `seq` in place of the next sequence number where given: the layer's own exchange, which
  // runs at once, on HMC's schedule.
  Call(core::CommImpl* ci, CollKind kind, const CollOptions& opt, std::optional<uint64_t> seq = std::nullopt);

  // Ok, or why the call cannot run (empty or unusable communicator).
  const Status& status() const { return status_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // What the argument check compares and the executor needs.
  DataType dtype = DataType::kUint8;
  std::optional<ReduceOp> op;   // set for reducing collectives
  std::size_t count = 0;
  int root = -1;
  std::size_t algo_bytes = 0;    // the size the algorithm rule looks at
  std::size_t result_bytes = 0;  // what Request::bytes reports
  bool empty = false;            // nothing to move (count 0)
  const void* where = nullptr;   // a user buffer: scratch goes on its device
  // all_to_all_v: elements sent to / expected from each rank, for the argument check.
  std::vector<uint64_t> to_peer, from_peer;
  // The user buffers it reads and writes, for host staging on a stream (stream_stage.h):
  // set for calls on a stream only; taken from `ccl` when both are left empty.
  std::vector<Extent> in, out;
  // Set by the collectives a vendor library can run (ccl.h): tried before HMC's schedule.
  std::optional<CclWork> ccl;

  using Build = std::function<Status(Plan&, Algo)>;
  Request run(const Build& build);

 private:
  // The call on HMC's own schedule (or the shared segments where they serve it): what run()
  // does unless the vendor library takes it, now or once delegation is decided (ccl.h),
  // with what run() chose.
  Request own(const Build& build);

  core::CommImpl* ci_ = nullptr;  // null when status_ says why not
  CollKind kind_;
  CollOptions opt_;  // a copy: a deferred own() outlives the caller's
  bool own_exchange_ = false;  // seq given
  CommState* state_ = nullptr;  // set by run(), with the two below
  Algo algo_{};
  bool check_ = false;
  Status status_;
  uint64_t seq_ = 0;
  int rank_ = -1;
  int size_ = 0;
};

// all_gather on the communicator's implementation (null: an empty communicator), for the
// layer's own exchanges, which may start where no Communicator is at hand (ccl.cpp).
Request all_gather_on(core::CommImpl* ci, const void* send, void* recv, std::size_t count, DataType dtype,
                      const CollOptions& opt, std::optional<uint64_t> seq = std::nullopt);

// Argument checks shared by the public functions; each returns kInvalidArgument.
Status check_dtype(DataType t);
Status check_op(ReduceOp op);
Status check_buffer(const void* p, std::size_t count, const char* what);
Status check_aligned(const void* p, DataType t, const char* what);
Status check_root(int root, int size);
Status check_fits(std::size_t count, std::size_t factor, DataType t);
// Out of place, [a, a+a_bytes) and [b, b+b_bytes) must not overlap.
Status check_disjoint(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes);

}  // namespace hmc::coll
