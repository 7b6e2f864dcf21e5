#include "collectives/ccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/call.h"
#include "collectives/comm_state.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::coll {
namespace {

constexpr int kAgreeTries = 4;
constexpr const char* kUndecidedText =
    "delegation was not decided within HMC_TIMEOUT (a rank has not reached its first delegable collective)";

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
  enum class State { kUndecided, kDeciding, kOn, kOff, kFailed };

  explicit CclLink(core::CommImpl& ci)
      : ci_(ci), ctx_(ci.context()), engine_(ctx_.engine()), rank_(ci.rank()), size_(ci.size()) {}
  ~CclLink() override;

  State state() const { return state_.load(); }
  Status failure() {
    std::lock_guard lock(mu_);
    return failure_;
  }
  bool supports(DataType t, ReduceOp op) const {
    return ccl_->ccl->supports(ccl_->state, static_cast<int>(t), static_cast<int>(op == ReduceOp::kAvg ? ReduceOp::kSum : op));
  }
  // From kUndecided: starts the agreement exchange for a call on `w` (kDeciding), or
  // decides at once where the cards settle it (kOff).
  void begin(const CclWork& w);
  // While kDeciding: the request of a call that waits for the decision (`own` runs it on
  // HMC's schedule if it is not delegated, and always when not `delegable`), or nullopt
  // once decided.
  std::optional<Request> defer(const CclWork& w, bool delegable, OwnCall own);
  // A collective that is not delegated: nullopt, or while kDeciding, its request waiting
  // behind the calls that wait (on a stream: waits here until decided).
  std::optional<Request> behind(CollKind kind, const CollOptions& opt, const std::function<OwnCall()>& later);
  // Waits until decided, for a call on a stream; false at HMC_TIMEOUT.
  bool settle();
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
  struct Offers {
    Offer mine;
    std::vector<Offer> all;
  };
  // A call made while deciding, and the request its caller holds.
  struct Deferred {
    CclWork w;
    bool delegable;
    OwnCall own;
    std::shared_ptr<core::Operation> proxy;
  };
  // Such a call once run: its own request, whose end is handed to the proxy.
  struct Forward {
    std::shared_ptr<core::Operation> proxy;
    Request inner;
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
  State off(std::string why);
  // Once the exchange has ended (one thread at a time): decides, then runs the calls that
  // waited; whether it did.
  bool conclude();
  // The decision from the offers (the vendor communicator made when on).
  State decide();
  // Runs the deferred calls in the order they were made, then sets the state to `decided`.
  void dispatch(State decided);
  // Ends the proxies of dispatched calls whose own request ended; whether one did. mu_ held.
  bool forward();
  void watch();  // on the engine's list from now on; mu_ held
  bool usable(const void* p, std::size_t bytes) const;
  Result<uint8_t*> stage(Placed& pl, const void* from, std::size_t bytes, void* stream);
  Result<Placed> place(const CclWork& w, void* stream);
  Status launch(const CclWork& w, const Placed& pl, void* stream);
  // Aborts the vendor communicator and fails what is pending; mu_ held.
  void fail_link(const Status& why);

  core::CommImpl& ci_;  // owns this link (through its CommState)
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
  // The exchange: set by begin() before the state becomes kDeciding, read once it ended.
  std::shared_ptr<Offers> offers_;
  Request agreement_;
  core::LoadedProvider* asked_ = nullptr;  // the collective provider the offers are about
  std::mutex mu_;  // guards the members below
  bool concluding_ = false;
  bool aborted_ = false;
  std::vector<Deferred> deferred_;
  std::vector<Forward> forwards_;
  std::vector<Pending> pending_;
  std::vector<void*> spare_events_;
  bool registered_ = false;
};

CclLink::~CclLink() {
  engine_->remove(this);
  std::lock_guard lock(mu_);  // a progress() already running finishes first
  const Status gone{ErrorCode::kFinalized, "the communicator was destroyed while the collective was pending"};
  for (auto& d : deferred_) d.proxy->fail(gone);
  for (auto& f : forwards_) f.proxy->fail(gone);
  // Work nobody waited for may never finish (a peer gone): cut it short instead.
  if (comm_) (pending_.empty() ? ccl_->ccl->comm_destroy : ccl_->ccl->comm_abort)(ccl_->state, comm_);
  for (auto& p : pending_) {
    p.op->fail({ErrorCode::kFinalized, "the communicator was destroyed while the collective was pending"});
    spare_events_.push_back(p.event);
  }
  for (void* e : spare_events_) dev_->dev->event_destroy(dev_->state, e);
  if (stream_) dev_->dev->stream_destroy(dev_->state, stream_);
}

CclLink::State CclLink::off(std::string why) {
  HMC_LOG("coll", info, "rank {}: collectives stay on HMC's own schedules: {}", rank_, why);
  return State::kOff;
}

void CclLink::watch() {
  if (registered_) return;
  engine_->add(this);
  registered_ = true;
}

void CclLink::begin(const CclWork& w) {
  // The cards every rank sent at creation settle the common case without an exchange:
  // no shared provider, no delegation. Every rank holds the same cards, so every rank
  // decides alike.
  core::CommImpl& ci = ci_;
  const std::vector<std::string>& first = ci.peer_info(0).ccl_providers;
  for (int r = 0; r < size_; ++r) {
    const auto& theirs = ci.peer_info(r).ccl_providers;
    if (theirs.empty() || first.empty() || theirs.front() != first.front()) {
      state_ = off("rank " + std::to_string(r) + " has " +
                   (theirs.empty() ? std::string("no collective provider") : "collective provider " + theirs.front()) +
                   (first.empty() || r == 0 ? "" : ", rank 0 has " + first.front()));
      return;
    }
  }
  auto offers = std::make_shared<Offers>();
  Offer& mine = offers->mine;
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
  offers->all.resize(static_cast<std::size_t>(size_));
  ci.keep_until_destroyed(offers);  // a failed exchange's receives may stay posted
  pool_ = comm_state(ci).scratch;
  CollOptions host_only;
  host_only.algorithm = "ring";  // a named algorithm is never delegated: no recursion
  host_only.check = false;
  Request exchange =
      all_gather_on(&ci, &offers->mine, offers->all.data(), sizeof(Offer), DataType::kUint8, host_only, kAgreeSeq);
  std::lock_guard lock(mu_);
  offers_ = std::move(offers);
  agreement_ = std::move(exchange);
  asked_ = cp;
  state_ = State::kDeciding;
  watch();  // progress() sees the exchange end
}

std::optional<Request> CclLink::defer(const CclWork& w, bool delegable, OwnCall own) {
  std::lock_guard lock(mu_);
  if (state_.load() != State::kDeciding) return std::nullopt;
  auto proxy = core::Operation::make(engine_);
  proxy->what = {coll_kind_name(w.kind), -1, 0, w.result_bytes};
  deferred_.push_back({w, delegable, std::move(own), proxy});
  return Request(proxy);
}

std::optional<Request> CclLink::behind(CollKind kind, const CollOptions& opt, const std::function<OwnCall()>& later) {
  while (state_.load() == State::kDeciding) {
    if (!opt.stream) {
      if (auto waiting = defer(CclWork{kind}, false, later())) return waiting;
    } else if (!settle()) {
      return failed_request({ErrorCode::kTimeout, std::string(coll_kind_name(kind)) + ": " + kUndecidedText});
    }
  }
  return std::nullopt;
}

bool CclLink::settle() {
  // As any wait: progress, then sleep until a wake once nothing moves (it spun a core).
  return engine_->wait_until(
      [&] {
        conclude();
        return state_.load() != State::kDeciding;
      },
      core::deadline_after(engine_->default_timeout));
}

bool CclLink::conclude() {
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || concluding_ || state_.load() != State::kDeciding || !core::op_of(agreement_)->done())
      return false;
    concluding_ = true;
  }
  dispatch(decide());
  return true;
}

CclLink::State CclLink::decide() {
  if (Status s = agreement_.status(); !s.ok()) return off("the delegation exchange failed: " + s.message());
  const Offer& mine = offers_->mine;
  const std::vector<Offer>& all = offers_->all;
  core::LoadedProvider* cp = asked_;
  for (int r = 0; r < size_; ++r)
    if (all[r].ready == kNoProvider) return off("rank " + std::to_string(r) + " could not make a communicator id");
  for (int r = 0; r < size_; ++r) {
    if (all[r].ready == kYes) continue;
    if (--tries_ == 0) return off("rank " + std::to_string(r) + " kept passing buffers that are not on " + cp->ccl->device_provider);
    return State::kUndecided;  // ask again at the next delegable call
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
  HMC_LOG("coll", info, "rank {}: collectives delegated to {} on {}:{}", rank_, cp->name, dev_->name, device_);
  return State::kOn;
}

void CclLink::dispatch(State decided) {
  for (;;) {
    std::vector<Deferred> batch;
    bool aborted = false;
    {
      std::lock_guard lock(mu_);
      if (deferred_.empty()) {
        if (state_.load() == State::kDeciding) state_ = decided;  // not over kFailed from a launch below
        concluding_ = false;
        return;
      }
      // Asked again: as on a rank where each call waited for the exchange it started, the
      // call that started this one runs now with the calls after it up to the next
      // delegable one, which starts another.
      auto end = deferred_.end();
      if (decided == State::kUndecided)
        end = std::find_if(deferred_.begin() + 1, deferred_.end(), [](const Deferred& d) { return d.delegable; });
      batch.assign(std::make_move_iterator(deferred_.begin()), std::make_move_iterator(end));
      deferred_.erase(deferred_.begin(), end);
      aborted = aborted_;
    }
    for (Deferred& d : batch) {
      const std::string name = coll_kind_name(d.w.kind);
      Request r;
      if (aborted) {
        r = failed_request({ErrorCode::kAborted, name + ": communicator was aborted"});
      } else if (d.delegable && state_.load() == State::kFailed) {  // a launch of this batch failed
        const Status why = failure();
        r = failed_request({why.code(), name + ": " + why.message()});
      } else if (d.delegable && decided == State::kOn && (!d.w.op || supports(d.w.dtype, *d.w.op))) {
        r = run(d.w, nullptr);
      } else {
        r = d.own();
      }
      std::lock_guard lock(mu_);
      forwards_.push_back({std::move(d.proxy), std::move(r)});
    }
    if (decided != State::kUndecided) continue;
    HMC_LOG("coll", debug, "rank {}: delegation undecided after exchange {} (some rank's buffers were elsewhere)", rank_,
            kAgreeTries - tries_);
    std::optional<CclWork> next;
    {
      std::lock_guard lock(mu_);
      if (!deferred_.empty()) next = deferred_.front().w;
    }
    if (!next) continue;
    begin(*next);  // the next exchange; its end concludes again
    std::lock_guard lock(mu_);
    if (state_.load() == State::kDeciding) {
      concluding_ = false;
      return;
    }
    decided = state_.load();  // begin() decided at once: run the rest so
  }
}

bool CclLink::forward() {
  bool any = false;
  for (std::size_t i = 0; i < forwards_.size();) {
    Forward& f = forwards_[i];
    const auto& op = core::op_of(f.inner);
    if (op && !op->done()) {
      ++i;
      continue;
    }
    if (Status s = f.inner.status(); s.ok()) f.proxy->complete(f.inner.bytes());
    else f.proxy->fail(s);
    forwards_.erase(forwards_.begin() + static_cast<std::ptrdiff_t>(i));
    any = true;
  }
  return any;
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
  // avg keeps HMC's rounding: the vendor's sum, then the device provider's division,
  // which a provider without the reduce capability need not have (device.h).
  if (avg && (dev_->dev->caps & HMC_DEV_CAP_REDUCE) == 0)
    return {ErrorCode::kUnsupported, "avg: device provider " + dev_->name + " cannot divide (no reduce capability)"};
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
  p.op->what = {coll_kind_name(w.kind), -1, 0, w.result_bytes};
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
  watch();
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
  bool any = state_.load() == State::kDeciding && conclude();
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return any;
  any = forward() || any;
  if (pending_.empty()) return any;
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
  aborted_ = true;
  const Status why{ErrorCode::kAborted, "communicator was aborted"};
  for (auto& d : deferred_) d.proxy->fail(why);
  deferred_.clear();
  for (auto& f : forwards_) f.proxy->fail(why);
  forwards_.clear();
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

std::optional<Request> try_delegate(core::CommImpl& ci, CommState& st, CollKind kind, const CclWork* w,
                                    const CollOptions& opt, const std::function<OwnCall()>& later) {
  // HMC_CCL=off ("auto" otherwise: Config allows no other value), a named algorithm or an
  // argument check asks for HMC's own schedule.
  const bool delegable = w && st.settings.ccl != "off" && ccl_kind(w->kind) && ci.size() >= 2 &&
                         opt.algorithm.empty() && !st.settings.algo_set && !opt.check.value_or(st.settings.check);
  // Every collective asks (undelegable ones whether to wait behind): the link, once made,
  // lives as long as the communicator, and is read without the lock.
  CclLink* link = st.ccl_link.load(std::memory_order_acquire);
  if (!link) {
    if (!delegable) return std::nullopt;
    std::lock_guard lock(st.mu);
    if (!st.ccl) {
      st.ccl = std::make_shared<CclLink>(ci);
      st.ccl_link.store(st.ccl.get(), std::memory_order_release);
    }
    link = st.ccl.get();
  }
  if (!delegable)
    return link->state() == CclLink::State::kDeciding ? link->behind(kind, opt, later) : std::nullopt;
  // Undecided, the call starts an exchange (at most kAgreeTries in all); while one runs,
  // the call waits for its end in the link, or here when it is on a stream.
  for (;;) {
    if (link->state() == CclLink::State::kUndecided) link->begin(*w);
    if (link->state() != CclLink::State::kDeciding) break;
    if (!opt.stream) {
      if (auto waiting = link->defer(*w, true, later())) return waiting;
    } else if (!link->settle()) {
      return failed_request({ErrorCode::kTimeout, std::string(coll_kind_name(kind)) + ": " + kUndecidedText});
    }
  }
  switch (link->state()) {
    case CclLink::State::kOn: break;
    case CclLink::State::kFailed: {
      const Status why = link->failure();
      return failed_request({why.code(), std::string(coll_kind_name(kind)) + ": " + why.message()});
    }
    default: return std::nullopt;
  }
  if (w->op && !link->supports(w->dtype, *w->op)) return std::nullopt;
  return link->run(*w, opt.stream);
}

void abort_delegation(CommState& st) {
  std::shared_ptr<CclLink> link;
  {
    std::lock_guard lock(st.mu);
    link = st.ccl;
  }
  if (link) link->abort();
}

}  // namespace hmc::coll
