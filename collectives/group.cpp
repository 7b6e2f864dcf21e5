// Grouped point-to-point: the operations are posted together when end() is called and
// complete together through one Request (NCCL's ncclGroupStart/End around send/recv).
//
// Group traffic uses one reserved tag; CommImpl matches a peer's messages of one tag in
// order, so the n-th send from A to B meets the n-th receive B posts from A, across
// groups, exactly as NCCL pairs them. Sizes must match exactly (else kMismatch).
#include "collectives/call.h"
#include "collectives/coll_op.h"
#include "collectives/comm_state.h"
#include "collectives/driver.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"

namespace hmc {

Group& Group::send(const void* buf, std::size_t count, DataType dtype, int peer) {
  return add(true, const_cast<void*>(buf), count, dtype, peer);
}

Group& Group::recv(void* buf, std::size_t count, DataType dtype, int peer) {
  return add(false, buf, count, dtype, peer);
}

// The first bad argument is kept for end() to report; the calls chain on regardless.
Group& Group::add(bool is_send, void* buf, std::size_t count, DataType dtype, int peer) {
  Status bad = coll::check_dtype(dtype);
  if (bad.ok() && count > SIZE_MAX / dtype_size(dtype))
    bad = {ErrorCode::kInvalidArgument,
           std::string(is_send ? "send" : "recv") + " of " + std::to_string(count) + " elements overflows size_t"};
  if (!bad.ok()) {
    if (error_.ok()) error_ = std::move(bad);
    return *this;
  }
  items_.push_back({is_send, buf, count * dtype_size(dtype), peer});
  return *this;
}

Request Group::end(const CollOptions& opt) {
  auto items = std::move(items_);
  items_.clear();
  Status error = std::move(error_);
  error_ = {};
  auto reject = [](const Status& s) { return coll::failed_request({s.code(), "group: " + s.message()}); };
  if (!error.ok()) return reject(error);
  if (comm_.size() == 0) return reject({ErrorCode::kInvalidArgument, "communicator is empty (moved from or never created)"});
  core::CommImpl& ci = comm_.impl();
  if (Status s = ci.usable(); !s.ok()) return reject(s);
  coll::Schedule sched;
  std::size_t total = 0;
  for (const Item& it : items) {
    if (it.peer < 0 || it.peer >= comm_.size())
      return reject({ErrorCode::kInvalidArgument,
                     "peer " + std::to_string(it.peer) + " is outside [0, " + std::to_string(comm_.size()) + ")"});
    if (!it.buf && it.bytes)
      return reject({ErrorCode::kInvalidArgument, "null buffer with " + std::to_string(it.bytes) + " bytes"});
    if (it.is_send) sched.send(it.buf, it.bytes, it.peer, coll::kGroupTag);
    else sched.recv(it.buf, it.bytes, it.peer, coll::kGroupTag);
    total += it.bytes;
  }
  core::ContextImpl& ctx = ci.context();
  const void* where = items.empty() ? nullptr : items.front().buf;
  std::vector<coll::Extent> in, out;
  if (opt.stream)
    for (const Item& it : items) (it.is_send ? in : out).push_back({it.buf, it.bytes});
  auto stage = coll::stage_for(ctx, coll::comm_state(ci), opt.stream, where, in, out);
  if (!stage) return reject(stage.status());
  coll::Scratch scratch(ctx, DeviceId{});
  stage->apply(sched, scratch);
  coll::CollSpec spec{"group", DataType::kUint8, ReduceOp::kSum, 1, total};
  auto order = coll::stream_order(ctx, where, opt.stream, stage->copies());
  if (!order) return reject(order.status());
  auto op = std::make_unique<coll::CollOp>(ci, 0, spec, std::move(sched), std::move(scratch));
  Request result(op->result());
  coll::Driver::of(ctx.engine()).launch(std::move(op), std::move(order.value()));
  return result;
}

}  // namespace hmc
