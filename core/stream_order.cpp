#include "core/stream_order.h"

#include <thread>

#include "core/context_impl.h"
#include "core/log.h"

namespace hmc::core {

Result<std::shared_ptr<StreamOrder>> StreamOrder::create(ContextImpl& ctx, LoadedProvider* p, int device, void* stream,
                                                         StreamCopies copies) {
  constexpr uint64_t kNeed = HMC_DEV_CAP_STREAMS | HMC_DEV_CAP_STREAM_FLAGS;
  if ((p->dev->caps & kNeed) != kNeed)
    return Status(ErrorCode::kUnsupported, "device provider " + p->name +
                                               " cannot order operations on a stream (needs streams and stream flags)");
  ctx.stream_retirement().sweep();
  std::shared_ptr<StreamOrder> o(new StreamOrder(ctx, p));
  o->device_ = device;
  auto fail = [&](const char* what) {
    o->finished_ = true;  // nothing queued on the stream waits yet: just free what was made
    return Status(ErrorCode::kInternal, std::string(what) + " on " + p->name + " failed: " + provider_error(*p));
  };
  const auto* d = p->dev;
  o->keep_ = std::move(copies.keep);
  for (const StreamCopy& c : copies.in)
    if (d->copy(p->state, c.dst, c.src, c.bytes, stream) != 0) return fail("queueing a copy on the stream");
  if (d->event_create(p->state, device, &o->before_) != 0) return fail("creating an event");
  if (d->event_record(p->state, o->before_, stream) != 0) return fail("recording an event on the stream");
  if (ctx.stream_retirement().take_flag(p, device, &o->flag_) != 0) return fail("allocating a stream flag");
  *o->flag_ = 0;
  if (d->event_create(p->state, device, &o->after_) != 0) return fail("creating an event");
  if (d->stream_wait_flag(p->state, stream, o->flag_, 1) != 0) return fail("queueing a flag wait on the stream");
  // Queued behind the wait: the stream may run them at any time from now on, so on
  // failure the flag is set and neither it nor what the copies read is ever freed.
  auto give_up = [&](const char* what) {
    Status s = fail(what);
    __atomic_store_n(o->flag_, 1u, __ATOMIC_RELEASE);
    o->flag_ = nullptr;
    leak_forever(std::move(o->keep_));
    return s;
  };
  for (const StreamCopy& c : copies.out)
    if (d->copy(p->state, c.dst, c.src, c.bytes, stream) != 0) return give_up("queueing a copy behind the flag wait");
  // Recorded behind the wait: once it completes, the flag may be freed.
  if (d->event_record(p->state, o->after_, stream) != 0) return give_up("recording an event behind the flag wait");
  o->finished_ = false;
  ctx.engine()->hold();
  return o;
}

StreamOrder::~StreamOrder() {
  if (!finished_) {
    finish();
    return;
  }
  // Never reached the stream: free here. After finish() the retirement list owns them.
  // Copies queued before the step that failed may still write what keep_ holds, and no
  // event tells when they are done: it is never freed (a provider failure, rare).
  leak_forever(std::move(keep_));
  if (flag_ || before_ || after_) ctx_.stream_retirement().add(p_, device_, flag_, after_, before_);
}

bool StreamOrder::ready() {
  int rc = p_->dev->event_query(p_->state, before_);
  if (rc < 0) HMC_LOG("core", warn, "querying a stream event on {} failed: {}", p_->name, provider_error(*p_));
  return rc != 1;
}

void StreamOrder::finish() {
  if (finished_) return;
  finished_ = true;
  __atomic_store_n(flag_, 1u, __ATOMIC_RELEASE);
  ctx_.stream_retirement().add(p_, device_, flag_, after_, before_, std::move(keep_));
  flag_ = nullptr;
  after_ = before_ = nullptr;
  ctx_.engine()->release();
}

StreamRetirement::~StreamRetirement() {
  // The context is going away: give streams a moment to pass their waits, then free.
  auto until = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    sweep();
    std::lock_guard lock(mu_);
    if (entries_.empty() || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard lock(mu_);
  for (auto& e : entries_) {
    if (e.before) e.p->dev->event_destroy(e.p->state, e.before);
    if (e.after) e.p->dev->event_destroy(e.p->state, e.after);
    // A stream still waiting on this flag would read freed memory: keep it, and the host
    // memory its copies read.
    leak_forever(std::move(e.keep));
    HMC_LOG("core", warn, "a device stream had not passed an HMC flag at context destruction; leaking the flag");
  }
  for (auto& f : spare_) f.p->dev->flag_free(f.p->state, f.flag);
}

void StreamRetirement::add(LoadedProvider* p, int device, volatile uint32_t* flag, void* after, void* before,
                           std::shared_ptr<void> keep) {
  std::lock_guard lock(mu_);
  entries_.push_back({p, device, flag, after, before, std::move(keep)});
}

int StreamRetirement::take_flag(LoadedProvider* p, int device, volatile uint32_t** flag) {
  {
    std::lock_guard lock(mu_);
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->p != p || it->device != device) continue;
      *flag = it->flag;
      spare_.erase(it);
      return 0;
    }
  }
  return p->dev->flag_alloc(p->state, device, flag);
}

void StreamRetirement::sweep() {
  std::lock_guard lock(mu_);
  std::erase_if(entries_, [this](Entry& e) {
    const auto* d = e.p->dev;
    if (e.after && d->event_query(e.p->state, e.after) == 1) return false;
    if (e.before) d->event_destroy(e.p->state, e.before);
    if (e.after) d->event_destroy(e.p->state, e.after);
    if (e.flag) spare_.push_back({e.p, e.device, e.flag});
    return true;
  });
}

}  // namespace hmc::core
