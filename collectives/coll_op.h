// CollOp: runs one collective's Schedule inside progress.
//
// The executor posts every send and receive whose dependencies are done, polls those in
// flight, and runs local actions (reduce, copy, divide) on the calling thread. Receives
// and sends that became ready are posted before the next local action runs, so the
// transfer of chunk k+1 overlaps the reduction of chunk k; local work per call is bounded
// so that the progress pass returns to CommImpl (which answers rendezvous requests)
// between chunks. A failed send or receive fails the collective with that status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/driver_op.h"
#include "collectives/schedule.h"
#include "collectives/scratch.h"
#include "hmc/status.h"
#include "hmc/types.h"

namespace hmc::core {
class CommImpl;
class ContextImpl;
class Operation;
}  // namespace hmc::core

namespace hmc::coll {

// The arguments one rank passes, as the argument check exchanges them. Every rank sends
// the same record to every other rank: this header, then (all_to_all_v; zeros otherwise)
// the elements it sends to each rank and the elements it expects from each, so that every
// rank sees every pair and all ranks reach the same verdict with the same message.
struct CheckDesc {
  uint32_t magic = 0x43484b32;  // "CHK2"
  uint32_t kind = 0;
  uint64_t count = 0;
  int32_t dtype = -1;
  int32_t op = -1;
  int32_t root = -1;
  int32_t algo = 0;
};
static_assert(sizeof(CheckDesc) == 32, "the argument check's wire layout");

struct CollSpec {
  const char* name;            // "all_reduce", for messages
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;  // passed to ContextImpl::reduce (sum for avg)
  uint64_t divisor = 1;          // avg: the rank count
  std::size_t result_bytes = 0;  // what Request::bytes reports
};

class CollOp final : public DriverOp {
 public:
  CollOp(core::CommImpl& comm, uint64_t tag_base, CollSpec spec, Schedule sched, Scratch scratch);
  ~CollOp() override;
  CollOp(const CollOp&) = delete;
  CollOp& operator=(const CollOp&) = delete;

  // Before start: exchange argument records first (`to`/`from`: all_to_all_v's counts,
  // or empty); any difference fails every rank with kMismatch before data moves.
  void add_check(const CheckDesc& mine, const std::vector<uint64_t>& to, const std::vector<uint64_t>& from);

  const std::shared_ptr<core::Operation>& result() const { return result_; }
  // Queues the actions that wait for nothing and posts the sends and receives among
  // them; local work (copies, reductions) waits for the first advance(), so the call that
  // starts a collective returns at once.
  void start() override;
  // Does what can be done without blocking; true when something happened.
  bool advance() override;
  bool finished() const override { return finished_; }
  // The context is going away: fail without touching the communicator again.
  void abandon(Status why) override;
  bool uses(const void* comm) const override { return comm == &comm_; }
  // The context stays, and with it the scratch: only the communicator goes.
  void drop(Status why) override { fail(why); }

 private:
  bool post_ready();
  bool poll();
  Status run_local(const Action& a);
  Status verify() const;
  void done(ActionId id);
  void fail(const Status& why);

  core::CommImpl& comm_;
  core::ContextImpl& ctx_;
  uint64_t tag_base_;
  CollSpec spec_;
  Schedule sched_;
  Scratch scratch_;
  std::shared_ptr<core::Operation> result_;

  std::vector<int32_t> waiting_;      // unfinished dependencies per action
  std::vector<uint32_t> child_begin_; // CSR of dependents
  std::vector<ActionId> children_;
  std::vector<uint32_t> fill_;        // start(): next free place per action in children_
  std::vector<ActionId> ready_p2p_, ready_local_;
  std::size_t p2p_head_ = 0, local_head_ = 0;
  std::vector<std::pair<ActionId, std::shared_ptr<core::Operation>>> inflight_;
  std::size_t remaining_ = 0;
  bool finished_ = false;

  std::vector<uint8_t> check_records_;  // one record per rank, this rank's included
  std::size_t check_record_bytes_ = 0;
  ActionId verify_gate_ = kNoAction;  // the action that runs verify()
};

}  // namespace hmc::coll
