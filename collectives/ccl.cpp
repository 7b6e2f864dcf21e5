#include "collectives/ccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "collectives/call.h"
#include "collectives/comm_state.h"
#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::coll {
namespace {

constexpr int kAgreeTries = 4;

// What each rank says in the agreement exchange.
enum Ready : int32_t { kYes = 0, kElsewhere = 1, kNoProvider = 2 };
struct Offer {
  int32_t ready = kNoProvider;
  int32_t device = -1;
  uint32_t id_len = 0;  // rank 0's vendor communicator id, when it is ready
  uint8_t id[HMC_CCL_ID_MAX] = {};
  char device_name[96] = {};  // "<host>/<pci bus id>": vendors want one rank per device
};

// The machine-wide name of `device` of provider `p` (the real host: vendors see that).
void name_device(core::LoadedProvider* p, int device, char* out, std::size_t cap) {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  hmc_device_info_t info{};
  info.struct_size = sizeof(info);
  if (p && p->dev->device_info(p->state, device, &info) == 0 && info.pci_bus_id[0])
    std::snprintf(out, cap, "%s/%s", host, info.pci_bus_id);
  else
    std::snprintf(out, cap, "%s/%s:%d", host, p ? p->name.c_str() : "?", device);
}

Status provider_status(core::LoadedProvider* p, const std::string& what) {
  return {ErrorCode::kInternal, what + ": " + core::provider_error(*p)};
}

// Memory the devices of `p` compute on: device memory, or host memory for a host provider
// (the test-only fake collective provider works on cpu memory).
bool native_memory(const core::ContextImpl::MemInfo& m, const std::string& provider) {
  return m.provider && m.provider->name == provider &&
         (m.device_mem || (m.provider->dev->caps & HMC_DEV_CAP_DEVICE_MEM) == 0);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

}  // namespace

// One communicator's delegation: its state, the vendor communicator, and the delegated
// collectives still running (each done when an event recorded behind it has passed).
class CclLink : public core::Progressable {
 public:
  enum class State { kUndecided, kOn, kOff, kFailed };

  CclLink(core::ContextImpl& ctx, int rank, int size) : ctx_(ctx), engine_(ctx.engine()), rank_(rank), size_(size) {}
  ~CclLink() override;

  State state() const { return state_.load(); }
  Status failure() {
    std::lock_guard lock(mu_);
    return failure_;
  }
  bool supports(DataType t, ReduceOp op) const {
    return ccl_->ccl->supports(ccl_->state, static_cast<int>(t), static_cast<int>(op == ReduceOp::kAvg ? ReduceOp::kSum : op));
  }
  void agree(Communicator& comm, const CclWork& w);
  Request run(const CclWork& w, void* user_stream);
  bool progress() override;
  // The communicator was aborted: where collectives still run, so is the vendor
  // communicator, and they fail now, not at their deadline (a collective some rank never
  // joins runs until then).
  void abort();

 private:
  struct Pending {
    std::shared_ptr<core::Operation> op;
    void* event;
    std::vector<Memory> blocks;
    Clock::time_point deadline;
    std::size_t bytes;
  };
  // This rank's buffers as the vendor library will see them.
  struct Placed {
    const void* send = nullptr;
    void* recv = nullptr;
    std::vector<Memory> blocks;
    void* out_dst = nullptr;  // staged result to copy back
    const void* out_src = nullptr;
    std::size_t out_bytes = 0;
  };
  void off(std::string why);
  bool usable(const void* p, std::size_t bytes) const;
  Result<uint8_t*> stage(Placed& pl, const void* from, std::size_t bytes, void* stream);
  Result<Placed> place(const CclWork& w, void* stream);
  Status launch(const CclWork& w, const Placed& pl, void* stream);
  // Aborts the vendor communicator and fails what is pending; mu_ held.
  void fail_link(const Status& why);

  core::ContextImpl& ctx_;
  std::shared_ptr<core::ProgressEngine> engine_;
  const int rank_, size_;
  std::atomic<State> state_{State::kUndecided};  // read by callers, set by progress too
  int tries_ = kAgreeTries;
  Status failure_;  // guarded by mu_
  core::LoadedProvider* ccl_ = nullptr;
  core::LoadedProvider* dev_ = nullptr;
  int device_ = -1;
  void* comm_ = nullptr;
  void* stream_ = nullptr;
  std::shared_ptr<ScratchPool> pool_;
  std::mutex mu_;  // guards pending_, spare_events_, registered_
  std::vector<Pending> pending_;
  std::vector<void*> spare_events_;
  bool registered_ = false;
};

CclLink::~CclLink() {
  engine_->remove(this);
  std::lock_guard lock(mu_);  // a progress() already running finishes first
  // Work nobody waited for may never finish (a peer gone): cut it short instead.
  if (comm_) (pending_.empty() ? ccl_->ccl->comm_destroy : ccl_->ccl->comm_abort)(ccl_->state, comm_);
  for (auto& p : pending_) {
    p.op->fail({ErrorCode::kFinalized, "the communicator was destroyed while the collective was pending"});
    spare_events_.push_back(p.event);
  }
  for (void* e : spare_events_) dev_->dev->event_destroy(dev_->state, e);
  if (stream_) dev_->dev->stream_destroy(dev_->state, stream_);
}

void CclLink::off(std::string why) {
  state_ = State::kOff;
  HMC_LOG("coll", info, "rank {}: collectives stay on HMC's own schedules: {}", rank_, why);
}

void CclLink::agree(Communicator& comm, const CclWork& w) {
  // The cards every rank sent at creation settle the common case without an exchange
  // (and so without the first call waiting for the others): no shared provider, no
  // delegation. Every rank holds the same cards, so every rank decides alike.
  core::CommImpl& ci = comm.impl();
  const std::vector<std::string>& first = ci.peer_info(0).ccl_providers;
  for (int r = 0; r < size_; ++r) {
    const auto& theirs = ci.peer_info(r).ccl_providers;
    if (theirs.empty() || first.empty() || theirs.front() != first.front())
      return off("rank " + std::to_string(r) + " has " +
                 (theirs.empty() ? std::string("no collective provider") : "collective provider " + theirs.front()) +
                 (first.empty() || r == 0 ? "" : ", rank 0 has " + first.front()));
  }
  // On the heap: an exchange whose wait fails may stay posted, and the communicator then
  // keeps them until it is destroyed.
  struct Offers {
    Offer mine;
    std::vector<Offer> all;
  };
  auto offers = std::make_shared<Offers>();
  Offer& mine = offers->mine;
  std::vector<Offer>& all = offers->all;
  core::LoadedProvider* cp = ctx_.registry().ccl(first.front());
  if (cp) {
    const void* where = w.recv_bytes ? static_cast<const void*>(w.recv) : w.send;
    auto mem = ctx_.mem_info(where, 1);
    mine.ready = native_memory(mem, cp->ccl->device_provider) ? kYes : kElsewhere;
    mine.device = mem.device;
    if (mine.ready == kYes) name_device(mem.provider, mem.device, mine.device_name, sizeof(mine.device_name));
    if (mine.ready == kYes && rank_ == 0) {
      std::size_t len = 0;
      if (cp->ccl->unique_id(cp->state, mine.id, sizeof(mine.id), &len) == 0) {
        mine.id_len = static_cast<uint32_t>(len);
      } else {
        HMC_LOG("coll", warn, "{}: no communicator id: {}", cp->name, core::provider_error(*cp));
        mine.ready = kNoProvider;
      }
    }
  }
  all.resize(static_cast<std::size_t>(size_));
  CollOptions host_only;
  host_only.algorithm = "ring";  // a named algorithm is never delegated: no recursion
  host_only.check = false;
  Status s = all_gather(comm, &mine, all.data(), sizeof(Offer), DataType::kUint8, host_only).wait();
  if (!s.ok()) {
    ci.keep_until_destroyed(offers);
    return off("the delegation exchange failed: " + s.message());
  }
  for (int r = 0; r < size_; ++r)
    if (all[r].ready == kNoProvider) return off("rank " + std::to_string(r) + " could not make a communicator id");
  for (int r = 0; r < size_; ++r) {
    if (all[r].ready == kYes) continue;
    if (--tries_ == 0) return off("rank " + std::to_string(r) + " kept passing buffers that are not on " + cp->ccl->device_provider);
    return;  // ask again at the next delegable call
  }
  const bool shared_ok = (cp->ccl->caps & HMC_CCL_CAP_SHARED_DEVICE) != 0;
  for (int r = 0; r < size_ && !shared_ok; ++r)
    for (int q = 0; q < r; ++q)
      if (std::strncmp(all[r].device_name, all[q].device_name, sizeof(all[r].device_name)) == 0)
        return off("ranks " + std::to_string(q) + " and " + std::to_string(r) + " share device " +
                   std::string(all[r].device_name, strnlen(all[r].device_name, sizeof(all[r].device_name))) + "; " +
                   cp->name + " needs one device per rank");
  ccl_ = cp;
  dev_ = ctx_.registry().device(cp->ccl->device_provider);
  device_ = mine.device;
  const auto timeout = engine_->default_timeout.count();
  // The local steps first: after the collective init, every rank must stay on.
  if (!dev_ || (dev_->dev->caps & HMC_DEV_CAP_STREAMS) == 0)
    return off("device provider " + std::string(cp->ccl->device_provider) + " has no streams");
  if (dev_->dev->stream_create(dev_->state, device_, &stream_) != 0) {
    stream_ = nullptr;
    HMC_LOG("coll", warn, "rank {}: no stream on {}:{}: {}; the other ranks fail at their deadline", rank_,
            dev_->name, device_, core::provider_error(*dev_));
  }
  if (!stream_ || cp->ccl->comm_init(cp->state, all[0].id, all[0].id_len, size_, rank_, device_, timeout, &comm_) != 0) {
    comm_ = nullptr;
    if (stream_)
      HMC_LOG("coll", warn, "rank {}: {} communicator not made: {}", rank_, cp->name, core::provider_error(*cp));
    return off(cp->name + " communicator not made");
  }
  pool_ = comm_state(comm.impl()).scratch;
  state_ = State::kOn;
  HMC_LOG("coll", info, "rank {}: collectives delegated to {} on {}:{}", rank_, cp->name, dev_->name, device_);
}

bool CclLink::usable(const void* p, std::size_t bytes) const {
  auto mem = ctx_.mem_info(p, bytes);
  return native_memory(mem, dev_->name) && mem.device == device_;
}

// A device block holding `bytes` (a copy of `from` when given), kept until the call ends.
Result<uint8_t*> CclLink::stage(Placed& pl, const void* from, std::size_t bytes, void* stream) {
  auto block = pool_->take(ctx_, DeviceId{dev_->name, device_}, bytes);
  if (!block) return block.status();
  auto* p = static_cast<uint8_t*>(block->data());
  pl.blocks.push_back(std::move(block.value()));
  if (from && dev_->dev->copy(dev_->state, p, from, bytes, stream) != 0)
    return provider_status(dev_, "staging a buffer on " + dev_->name);
  return p;
}

Result<CclLink::Placed> CclLink::place(const CclWork& w, void* stream) {
  Placed pl;
  auto* s = static_cast<const uint8_t*>(w.send);
  auto* r = static_cast<uint8_t*>(w.recv);
  pl.send = s;
  pl.recv = r;
  if (w.kind == CollKind::kAllToAll && s == r) {
    // Sending from the buffer being received into would race: send from a copy.
    auto copy = stage(pl, s, w.send_bytes, stream);
    if (!copy) return copy.status();
    pl.send = copy.value();
  } else if (overlaps(s, w.send_bytes, r, w.recv_bytes)) {
    // In place: stage the span of both at once, so that the layout holds.
    const uint8_t* lo = std::min<const uint8_t*>(s, r);
    const uint8_t* hi = std::max<const uint8_t*>(s + w.send_bytes, r + w.recv_bytes);
    if (usable(lo, static_cast<std::size_t>(hi - lo))) return pl;
    auto span = stage(pl, lo, static_cast<std::size_t>(hi - lo), stream);
    if (!span) return span.status();
    pl.send = span.value() + (s - lo);
    pl.recv = span.value() + (r - lo);
    pl.out_dst = r;
    pl.out_src = pl.recv;
    pl.out_bytes = w.recv_bytes;
    return pl;
  } else if (w.send_bytes && !usable(s, w.send_bytes)) {
    auto copy = stage(pl, s, w.send_bytes, stream);
    if (!copy) return copy.status();
    pl.send = copy.value();
  }
  if (w.recv_bytes && !usable(r, w.recv_bytes)) {
    auto out = stage(pl, nullptr, w.recv_bytes, stream);
    if (!out) return out.status();
    pl.recv = out.value();
    pl.out_dst = r;
    pl.out_src = pl.recv;
    pl.out_bytes = w.recv_bytes;
  }
  return pl;
}

Status CclLink::launch(const CclWork& w, const Placed& pl, void* stream) {
  const auto* c = ccl_->ccl;
  void* st = ccl_->state;
  const int t = static_cast<int>(w.dtype);
  const bool avg = w.op == ReduceOp::kAvg;
  const int op = static_cast<int>(avg ? ReduceOp::kSum : w.op.value_or(ReduceOp::kSum));
  void* recv = pl.recv ? pl.recv : const_cast<void*>(pl.send);  // reduce: recv matters at the root only
  auto vendor = [&](int rc) { return rc == 0 ? Status() : provider_status(ccl_, ccl_->name); };
  // avg keeps HMC's rounding: the vendor's sum, then the device provider's division.
  auto divide = [&](Status s, void* buf, bool here) {
    if (!s.ok() || !avg || !here) return s;
    if (dev_->dev->divide(dev_->state, buf, w.count, t, static_cast<uint64_t>(size_), stream) == 0) return s;
    return provider_status(dev_, "avg: dividing on " + dev_->name);
  };
  switch (w.kind) {
    case CollKind::kAllReduce:
      return divide(vendor(c->all_reduce(st, comm_, pl.send, recv, w.count, t, op, stream)), recv, true);
    case CollKind::kReduce:
      return divide(vendor(c->reduce(st, comm_, pl.send, recv, w.count, t, op, w.root, stream)), recv, rank_ == w.root);
    case CollKind::kBroadcast: return vendor(c->broadcast(st, comm_, pl.send, recv, w.count, t, w.root, stream));
    case CollKind::kAllGather: return vendor(c->all_gather(st, comm_, pl.send, recv, w.count, t, stream));
    case CollKind::kReduceScatter:
      return divide(vendor(c->reduce_scatter(st, comm_, pl.send, recv, w.count, t, op, stream)), recv, true);
    case CollKind::kAllToAll: {
      const std::size_t block = w.count * dtype_size(w.dtype);
      int rc = c->group_start(st);
      for (int p = 0; p < size_ && rc == 0; ++p) {
        rc = c->send(st, comm_, static_cast<const uint8_t*>(pl.send) + p * block, w.count, t, p, stream);
        if (rc == 0) rc = c->recv(st, comm_, static_cast<uint8_t*>(recv) + p * block, w.count, t, p, stream);
      }
      Status s = vendor(rc);
      const int end = c->group_end(st, comm_);  // always closed, even after a failed call
      return s.ok() ? vendor(end) : s;
    }
    default: return {ErrorCode::kUnsupported, "not a delegable collective"};
  }
}

Request CclLink::run(const CclWork& w, void* user_stream) {
  const char* name = coll_kind_name(w.kind);
  auto failed = [&](const Status& s) { return failed_request({s.code(), std::string(name) + ": " + s.message()}); };
  void* stream = user_stream ? user_stream : stream_;
  auto placed = place(w, stream);
  if (!placed) return failed(placed.status());
  Placed& pl = placed.value();
  if (Status s = launch(w, pl, stream); !s.ok()) {
    // Other ranks may have queued theirs: the abort ends them, and every later
    // delegated call here fails the same way.
    HMC_LOG("coll", err, "rank {}: {}", rank_, s.message());
    std::lock_guard lock(mu_);
    fail_link(s);
    return failed(s);
  }
  if (pl.out_bytes && dev_->dev->copy(dev_->state, pl.out_dst, pl.out_src, pl.out_bytes, stream) != 0)
    return failed(provider_status(dev_, "copying the result back"));
  Pending p{core::Operation::make(engine_), nullptr, std::move(pl.blocks),
            core::deadline_after(engine_->default_timeout), w.result_bytes};
  {
    std::lock_guard lock(mu_);
    if (!spare_events_.empty()) {
      p.event = spare_events_.back();
      spare_events_.pop_back();
    }
  }
  if (!p.event && dev_->dev->event_create(dev_->state, device_, &p.event) != 0)
    return failed(provider_status(dev_, "creating an event"));
  if (dev_->dev->event_record(dev_->state, p.event, stream) != 0) {
    dev_->dev->event_destroy(dev_->state, p.event);
    return failed(provider_status(dev_, "recording an event"));
  }
  Request result(p.op);
  std::lock_guard lock(mu_);
  pending_.push_back(std::move(p));
  if (!registered_) {
    engine_->add(this);
    registered_ = true;
  }
  return result;
}

void CclLink::fail_link(const Status& why) {
  failure_ = why;
  state_ = State::kFailed;
  if (comm_) ccl_->ccl->comm_abort(ccl_->state, comm_);
  comm_ = nullptr;
  for (auto& p : pending_) {
    p.op->fail(why);
    spare_events_.push_back(p.event);  // the aborted communicator ran nothing more behind it
  }
  pending_.clear();  // the blocks go with them: freed, not reused
}

bool CclLink::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || pending_.empty()) return false;
  bool any = false;
  for (std::size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    const int q = dev_->dev->event_query(dev_->state, p.event);
    if (q == 0) {
      p.op->complete(p.bytes);
      for (auto& b : p.blocks) pool_->give(std::move(b));
      spare_events_.push_back(p.event);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      any = true;
      continue;
    }
    ++i;
  }
  // Work still on the device counts as movement: waiters keep polling its events, as
  // cudaStreamSynchronize would, rather than sleeping until a wake that nothing sends.
  if (pending_.empty()) return any;
  any = true;
  Status why;
  if (ccl_->ccl->comm_status(ccl_->state, comm_) != 0)
    why = Status(ErrorCode::kPeerLost, ccl_->name + " communicator failed: " + core::provider_error(*ccl_));
  else if (Clock::now() > pending_.front().deadline)
    why = Status(ErrorCode::kTimeout, ccl_->name + " collective not done within HMC_TIMEOUT; its communicator is aborted");
  if (!why.ok()) {
    HMC_LOG("coll", err, "rank {}: {}", rank_, why.message());
    fail_link(why);
  }
  return any;
}

void CclLink::abort() {
  std::lock_guard lock(mu_);
  // Nothing running: the vendor communicator is destroyed with this link, as after finalize().
  if (state_.load() != State::kOn || pending_.empty()) return;
  HMC_LOG("coll", debug, "rank {}: {} communicator aborted with its communicator ({} pending)", rank_, ccl_->name,
          pending_.size());
  fail_link({ErrorCode::kAborted, "communicator was aborted"});
}

bool ccl_kind(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce:
    case CollKind::kReduce:
    case CollKind::kBroadcast:
    case CollKind::kAllGather:
    case CollKind::kReduceScatter:
    case CollKind::kAllToAll: return true;
    default: return false;
  }
}

std::optional<Request> try_delegate(Communicator& comm, CommState& st, const CclWork& w, const CollOptions& opt) {
  core::ContextImpl& ctx = comm.impl().context();
  const std::string& mode = st.settings.ccl;
  if (mode == "off") return std::nullopt;  // else "auto": Config allows no other value
  // A named algorithm or an argument check asks for HMC's own schedule.
  if (!ccl_kind(w.kind) || comm.size() < 2 || !opt.algorithm.empty() || st.settings.algo_set ||
      opt.check.value_or(st.settings.check))
    return std::nullopt;
  std::shared_ptr<CclLink> link;
  {
    std::lock_guard lock(st.mu);
    if (!st.ccl) {
      st.ccl = std::make_shared<CclLink>(ctx, comm.rank(), comm.size());
      comm.impl().on_abort([weak = std::weak_ptr<CclLink>(st.ccl)] {
        if (auto l = weak.lock()) l->abort();
      });
    }
    link = st.ccl;
  }
  if (link->state() == CclLink::State::kUndecided) link->agree(comm, w);
  switch (link->state()) {
    case CclLink::State::kOn: break;
    case CclLink::State::kFailed: {
      const Status why = link->failure();
      return failed_request({why.code(), std::string(coll_kind_name(w.kind)) + ": " + why.message()});
    }
    default: return std::nullopt;
  }
  if (w.op && !link->supports(w.dtype, *w.op)) return std::nullopt;
  return link->run(w, opt.stream);
}

}  // namespace hmc::coll
