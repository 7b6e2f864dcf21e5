#include "collectives/coll_op.h"

#include <cstring>

#include "collectives/reuse.h"
#include "collectives/select.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::coll {
namespace {

// Local work (bytes reduced or copied) per advance() before returning to the progress
// pass, so that rendezvous handshakes of the next chunks are answered in between.
constexpr std::size_t kLocalBudget = 256 * 1024;

bool is_p2p(ActKind k) { return k == ActKind::kSend || k == ActKind::kRecv; }

std::string kind_text(uint32_t k) { return k < kNumCollKinds ? coll_kind_name(static_cast<CollKind>(k)) : "?"; }
std::string dtype_text(int32_t d) { return d >= 0 && d < kNumDataTypes ? dtype_name(static_cast<DataType>(d)) : "none"; }
std::string op_text(int32_t o) { return o >= 0 && o < kNumReduceOps ? op_name(static_cast<ReduceOp>(o)) : "none"; }

}  // namespace

CollOp::CollOp(core::CommImpl& comm, uint64_t tag_base, CollSpec spec, Schedule sched, Scratch scratch)
    : comm_(comm),
      ctx_(comm.context()),
      tag_base_(tag_base),
      spec_(spec),
      sched_(std::move(sched)),
      scratch_(std::move(scratch)),
      result_(core::Operation::make(comm.context().engine())) {
  result_->what = {spec_.name, -1, 0, spec_.result_bytes};
}

CollOp::~CollOp() {
  // Receives still posted into scratch may yet be matched: keep their memory alive.
  for (auto& [id, op] : inflight_)
    if (!op->done()) {
      scratch_.leak();
      break;
    }
  inflight_.clear();  // drop the operations before the storage goes on the shelf
  give_all(waiting_, child_begin_, children_, fill_, ready_p2p_, ready_local_, inflight_);
}

void CollOp::add_check(const CheckDesc& mine, const std::vector<uint64_t>& to, const std::vector<uint64_t>& from) {
  const int n = comm_.size(), me = comm_.rank();
  check_record_bytes_ = sizeof(CheckDesc) + 2 * n * sizeof(uint64_t);
  check_records_.assign(check_record_bytes_ * n, 0);
  uint8_t* own = check_records_.data() + check_record_bytes_ * me;
  std::memcpy(own, &mine, sizeof(mine));
  auto* counts = reinterpret_cast<uint64_t*>(own + sizeof(CheckDesc));
  for (std::size_t j = 0; j < to.size() && j < static_cast<std::size_t>(n); ++j) counts[j] = to[j];
  for (std::size_t j = 0; j < from.size() && j < static_cast<std::size_t>(n); ++j) counts[n + j] = from[j];
  // The gate runs verify() once every record is in; every action of the collective that
  // waits for nothing else waits for it.
  ActionId gate = sched_.join({});
  sched_.gate_roots(gate);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    sched_.depend(gate, sched_.recv(check_records_.data() + check_record_bytes_ * j, check_record_bytes_, j,
                                    subtag(kCheckStep)));
    sched_.send(own, check_record_bytes_, j, subtag(kCheckStep));
  }
  verify_gate_ = gate;
}

void CollOp::start() {
  const std::size_t n = sched_.size();
  take_all(waiting_, child_begin_, children_, fill_, ready_p2p_, ready_local_, inflight_);
  waiting_.assign(n, 0);
  child_begin_.assign(n + 1, 0);
  for (auto [on, id] : sched_.edges()) {
    ++waiting_[id];
    ++child_begin_[on + 1];
  }
  for (std::size_t i = 0; i < n; ++i) child_begin_[i + 1] += child_begin_[i];
  children_.resize(sched_.edges().size());
  fill_.assign(child_begin_.begin(), child_begin_.end() - 1);
  for (auto [on, id] : sched_.edges()) children_[fill_[on]++] = id;
  remaining_ = n;
  for (std::size_t i = 0; i < n; ++i)
    if (waiting_[i] == 0) (is_p2p(sched_.at(i).kind) ? ready_p2p_ : ready_local_).push_back(static_cast<ActionId>(i));
  if (n == 0) {
    finished_ = true;
    result_->complete(spec_.result_bytes);
    return;
  }
  post_ready();
  if (!finished_ && remaining_ == 0) {
    finished_ = true;
    result_->complete(spec_.result_bytes);
  }
}

void CollOp::done(ActionId id) {
  --remaining_;
  for (uint32_t i = child_begin_[id]; i < child_begin_[id + 1]; ++i) {
    ActionId c = children_[i];
    if (--waiting_[c] == 0) (is_p2p(sched_.at(c).kind) ? ready_p2p_ : ready_local_).push_back(c);
  }
}

void CollOp::fail(const Status& why) {
  if (finished_) return;
  finished_ = true;
  HMC_LOG("coll", debug, "{} failed: {}", spec_.name, why.to_string());
  result_->fail({why.code(), std::string(spec_.name) + ": " + why.message()});
}

void CollOp::abandon(Status why) {
  fail(why);
  scratch_.leak();  // the context that owns device scratch is going away
}

// What is ready is posted whole even when one of it fails at once (a receive matching a
// message of another size): a group's operations are posted together, and a receive left
// unposted would leave the peer's rendezvous send unanswered, holding its finalize() for
// HMC_TIMEOUT. Nothing that becomes ready after a failure is posted.
bool CollOp::post_ready() {
  if (finished_) return false;
  bool any = false;
  const std::size_t batch = ready_p2p_.size();
  while (p2p_head_ < ready_p2p_.size() && (!finished_ || p2p_head_ < batch)) {
    ActionId id = ready_p2p_[p2p_head_++];
    const Action& a = sched_.at(id);
    uint64_t tag = (a.subtag & kReservedBit) ? a.subtag : tag_base_ | a.subtag;
    auto op = a.kind == ActKind::kSend ? comm_.isend(a.a, a.n, a.peer, tag) : comm_.irecv(a.dst, a.n, a.peer, tag);
    any = true;
    if (!op->done()) {
      inflight_.emplace_back(id, std::move(op));
    } else if (Status s = op->status(); !s.ok()) {
      fail(s);
    } else if (!finished_) {
      done(id);
    }
  }
  if (p2p_head_ == ready_p2p_.size()) {
    ready_p2p_.clear();
    p2p_head_ = 0;
  }
  return any;
}

bool CollOp::poll() {
  bool any = false;
  for (std::size_t i = 0; i < inflight_.size() && !finished_;) {
    if (!inflight_[i].second->done()) {
      ++i;
      continue;
    }
    any = true;
    Status s = inflight_[i].second->status();
    ActionId id = inflight_[i].first;
    inflight_[i] = std::move(inflight_.back());
    inflight_.pop_back();
    if (!s.ok()) fail(s);
    else done(id);
  }
  return any;
}

Status CollOp::run_local(const Action& a) {
  switch (a.kind) {
    case ActKind::kReduce: return ctx_.reduce(a.dst, a.a, a.b, a.n, spec_.dtype, spec_.op);
    case ActKind::kCopy: return ctx_.copy(a.dst, a.a, a.n);
    case ActKind::kDivide: return ctx_.divide(a.dst, a.n, spec_.dtype, spec_.divisor);
    default: return {};
  }
}

bool CollOp::advance() {
  if (finished_) return false;
  bool any = poll();
  any |= post_ready();
  std::size_t budget = 0;
  while (local_head_ < ready_local_.size() && !finished_) {
    ActionId id = ready_local_[local_head_++];
    const Action& a = sched_.at(id);
    Status s = id == verify_gate_ ? verify() : run_local(a);
    if (!s.ok()) {
      fail(s);
      break;
    }
    any = true;
    done(id);
    post_ready();
    if (a.kind == ActKind::kReduce || a.kind == ActKind::kDivide) budget += a.n * dtype_size(spec_.dtype);
    else if (a.kind == ActKind::kCopy) budget += a.n;
    if (budget >= kLocalBudget) break;
  }
  if (local_head_ == ready_local_.size()) {
    ready_local_.clear();
    local_head_ = 0;
  }
  if (!finished_ && remaining_ == 0) {
    finished_ = true;
    result_->complete(spec_.result_bytes);
  }
  return any;
}

Status CollOp::verify() const {
  const int n = comm_.size();
  auto record = [&](int j) {
    CheckDesc d;
    std::memcpy(&d, check_records_.data() + check_record_bytes_ * j, sizeof(d));
    return d;
  };
  auto counts = [&](int j) {
    return reinterpret_cast<const uint64_t*>(check_records_.data() + check_record_bytes_ * j + sizeof(CheckDesc));
  };
  auto differ = [&](const std::string& what) {
    return Status(ErrorCode::kMismatch, "arguments differ across ranks: " + what);
  };
  // Every rank compares the same records in the same order: the same verdict everywhere.
  const CheckDesc e = record(0);
  for (int j = 1; j < n; ++j) {
    const CheckDesc g = record(j);
    std::string them = "rank " + std::to_string(j), first = ", rank 0 ";
    if (g.magic != e.magic) return differ(them + " sent a malformed argument check");
    if (g.kind != e.kind) return differ(them + " called " + kind_text(g.kind) + first + "called " + kind_text(e.kind));
    if (g.count != e.count)
      return differ(them + " passed count " + std::to_string(g.count) + first + "count " + std::to_string(e.count));
    if (g.dtype != e.dtype) return differ(them + " passed dtype " + dtype_text(g.dtype) + first + dtype_text(e.dtype));
    if (g.op != e.op) return differ(them + " passed op " + op_text(g.op) + first + op_text(e.op));
    if (g.root != e.root)
      return differ(them + " passed root " + std::to_string(g.root) + first + "root " + std::to_string(e.root));
    if (g.algo != e.algo)
      return differ(them + " chose algorithm " + algo_name(static_cast<Algo>(g.algo)) + first +
                    algo_name(static_cast<Algo>(e.algo)) + " (HMC_ALGO or CollOptions::algorithm differ)");
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      uint64_t sends = counts(i)[j], expects = counts(j)[n + i];
      if (sends != expects)
        return differ("rank " + std::to_string(i) + " sends " + std::to_string(sends) + " elements to rank " +
                      std::to_string(j) + ", which expects " + std::to_string(expects));
    }
  return {};
}

}  // namespace hmc::coll
