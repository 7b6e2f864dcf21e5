#include "collectives/call.h"

#include <cstdint>

#include "collectives/algorithms.h"
#include "collectives/coll_op.h"
#include "collectives/comm_state.h"
#include "collectives/driver.h"
#include "collectives/shm_coll.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"

namespace hmc::coll {
namespace {

constexpr std::size_t kDefaultChunk = 1 << 20;

Status invalid(std::string why) { return {ErrorCode::kInvalidArgument, std::move(why)}; }

}  // namespace

Result<std::shared_ptr<core::StreamOrder>> stream_order(core::ContextImpl& ctx, const void* where, void* stream,
                                                        core::StreamCopies copies) {
  if (!stream) return std::shared_ptr<core::StreamOrder>();
  if (!where)
    return Status(ErrorCode::kInvalidArgument, "a stream was given but no device buffer tells which device it belongs to");
  auto mem = ctx.mem_info(where, 1);
  return core::StreamOrder::create(ctx, mem.provider, mem.device, stream, std::move(copies));
}

Result<StreamStage> stage_for(core::ContextImpl& ctx, const CommState& state, void* stream, const void* where,
                              const std::vector<Extent>& in, const std::vector<Extent>& out) {
  if (!stream || !state.settings.stream_stage) return StreamStage();
  return StreamStage::make(ctx, state.scratch, state.settings.stream_stage_max, where, in, out);
}

Request failed_request(Status s) { return Request(core::Operation::failed(std::move(s))); }

Call::Call(Communicator& comm, CollKind kind, const CollOptions& opt)
    : Call(comm.size() ? &comm.impl() : nullptr, kind, opt) {}

Call::Call(core::CommImpl* ci, CollKind kind, const CollOptions& opt, std::optional<uint64_t> seq)
    : ci_(ci), kind_(kind), opt_(opt) {
  if (!ci) {
    status_ = invalid("communicator is empty (moved from or never created)");
    return;
  }
  rank_ = ci->rank();
  size_ = ci->size();
  seq_ = seq ? *seq : next_sequence(*ci);
  own_exchange_ = seq.has_value();
  // Before anything runs: a call with nothing to move (count 0, or one rank) would
  // otherwise succeed on a communicator that finalize() or abort() ended.
  status_ = ci->usable();
}

Request Call::run(const Build& build) {
  const char* name = coll_kind_name(kind_);
  auto prefixed = [&](const Status& s) { return Status(s.code(), std::string(name) + ": " + s.message()); };
  if (!status_.ok()) return failed_request(prefixed(status_));
  state_ = &comm_state(*ci_);
  auto algo = choose_algorithm(state_->settings, kind_, opt_.algorithm, algo_bytes, size_);
  if (!algo) return failed_request(prefixed(algo.status()));
  algo_ = algo.value();
  check_ = opt_.check.value_or(state_->settings.check) && size_ > 1;
  if (empty && !check_) {
    auto done = core::Operation::make(ci_->context().engine());
    done->complete(0);
    return Request(done);
  }
  // While delegation is being decided the call waits in the delegation, delegable or not,
  // with a copy of this call to run on HMC's schedule if it is not delegated (made only then).
  auto later = [&] { return OwnCall([call = *this, build]() mutable { return call.own(build); }); };
  if (!own_exchange_)
    if (auto taken = try_delegate(*ci_, *state_, kind_, ccl && !empty ? &*ccl : nullptr, opt_, later))
      return std::move(*taken);
  return own(build);
}

Request Call::own(const Build& build) {
  const char* name = coll_kind_name(kind_);
  auto prefixed = [&](const Status& s) { return Status(s.code(), std::string(name) + ": " + s.message()); };
  core::CommImpl& ci = *ci_;
  core::ContextImpl& ctx = ci.context();
  CommState& state = *state_;
  const CollSettings& settings = state.settings;
  if (ccl && !empty && size_ > 1)
    if (auto shared = try_shm(ci, state, *ccl, opt_, seq_)) return std::move(*shared);
  // Every rank must cut alike, so the rule sees only arguments all ranks share (a mixed
  // job's ranks hold different memory kinds): each chunk costs a handshake, which device
  // copies (hundreds of GB/s) notice most, so large messages get larger chunks.
  std::size_t chunk_bytes = settings.chunk;
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunk;
  if (int64_t pieces = settings.max_chunks; pieces > 0)
    chunk_bytes = std::max(chunk_bytes, algo_bytes / static_cast<std::size_t>(pieces));
  const std::size_t esz = dtype_size(dtype);
  if (opt_.stream && in.empty() && out.empty() && ccl) {
    in = {{ccl->send, ccl->send_bytes}};
    out = {{ccl->recv, ccl->recv_bytes}};
  }
  auto stage = stage_for(ctx, state, empty ? nullptr : opt_.stream, where, in, out);
  if (!stage) return failed_request(prefixed(stage.status()));
  Schedule sched;
  // Staged, the schedule runs on host copies: its scratch is host memory too.
  Scratch scratch(ctx, stage->empty() ? ctx.device_of(where) : DeviceId{}, state.scratch);
  Plan plan{sched, scratch, rank_, size_, esz, std::max<std::size_t>(1, chunk_bytes / esz), op == ReduceOp::kAvg};
  if (!empty)
    if (Status s = build(plan, algo_); !s.ok()) return failed_request(prefixed(s));
  stage->apply(sched, scratch);
  CollSpec spec{name, dtype, op && *op != ReduceOp::kAvg ? *op : ReduceOp::kSum, static_cast<uint64_t>(size_),
                result_bytes};
  auto coll = std::make_unique<CollOp>(ci, tag_base(seq_), spec, std::move(sched), std::move(scratch));
  if (check_) {
    CheckDesc mine;
    mine.kind = static_cast<uint32_t>(kind_);
    mine.count = count;
    mine.dtype = static_cast<int32_t>(dtype);
    mine.op = op ? static_cast<int32_t>(*op) : -1;
    mine.root = root;
    // all_to_all_v's rule reads this rank's own mean block, which the ranks need not share,
    // and its two algorithms differ only in how many steps are in flight: only one asked
    // for (HMC_ALGO, CollOptions::algorithm) must be alike.
    const bool by_own_rule = kind_ == CollKind::kAllToAllV && opt_.algorithm.empty() &&
                             settings.algo[static_cast<uint32_t>(kind_)] == Algo::kAuto;
    mine.algo = static_cast<int32_t>(by_own_rule ? Algo::kAuto : algo_);
    coll->add_check(mine, to_peer, from_peer);
  }
  auto order = stream_order(ctx, where, opt_.stream, stage->copies());
  if (!order) return failed_request(prefixed(order.status()));
  Request result(coll->result());
  Driver::of(ctx.engine()).launch(std::move(coll), std::move(order.value()));
  return result;
}

Status check_dtype(DataType t) {
  int v = static_cast<int>(t);
  if (v < 0 || v >= kNumDataTypes) return invalid("unknown dtype " + std::to_string(v));
  return {};
}

Status check_op(ReduceOp op) {
  int v = static_cast<int>(op);
  if (v < 0 || v >= kNumReduceOps) return invalid("unknown reduce op " + std::to_string(v));
  return {};
}

Status check_buffer(const void* p, std::size_t count, const char* what) {
  if (!p && count > 0) return invalid(std::string("null ") + what + " buffer with count " + std::to_string(count));
  return {};
}

Status check_aligned(const void* p, DataType t, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(t) != 0)
    return invalid(std::string(what) + " buffer is not aligned to its " + std::to_string(dtype_size(t)) + "-byte " +
                   dtype_name(t) + " elements");
  return {};
}

Status check_root(int root, int size) {
  if (root < 0 || root >= size)
    return invalid("root " + std::to_string(root) + " is outside [0, " + std::to_string(size) + ")");
  return {};
}

Status check_fits(std::size_t count, std::size_t factor, DataType t) {
  if (factor && count > SIZE_MAX / factor / dtype_size(t))
    return invalid("count " + std::to_string(count) + " overflows the address space");
  return {};
}

Status check_disjoint(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  if (a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes)
    return invalid("send and recv overlap without being the in-place layout");
  return {};
}

}  // namespace hmc::coll
