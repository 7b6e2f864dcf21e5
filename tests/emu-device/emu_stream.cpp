// Streams, events and flags of the emulated device.
//
// Handles are keys of the State's tables and are only ever looked up, never
// dereferenced, so a foreign or stale handle is INVALID rather than a crash. An
// event's record is a generation number: event_record bumps it and queues an
// operation that marks it reached; a wait captures the generation current at the
// call, as CUDA does. A record that a destroyed stream dropped fails the event, and a
// stream that waits on a failed event fails too (sticky, like a GPU's async error).
#include "emu_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <new>
#include <thread>
#include <vector>

#include "emu_ops.h"

namespace hmc::emu {

struct Event {
  int device = 0;
  std::atomic<uint64_t> recorded{0};  // generation of the latest event_record
  std::atomic<uint64_t> reached{0};   // highest generation its stream got to
  std::atomic<uint64_t> failed{0};    // highest generation a destroyed stream dropped
  std::mutex mu;
  std::string why;  // what failed the stream that dropped it
};

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kMinPoll = std::chrono::microseconds(20);
constexpr auto kMaxPoll = std::chrono::milliseconds(1);

void raise_to(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

int check_device(const State* s, const char* what, int device) {
  if (device < 0 || device >= s->devices) {
    return fail(HMC_PROV_ERR_INVALID, "%s: no device %d (this emulator has %d)", what, device,
                s->devices);
  }
  return HMC_PROV_OK;
}

template <class T>
std::shared_ptr<T> find(State* s, std::map<const void*, std::shared_ptr<T>>& table,
                        const void* handle, const char* what, const char* kind, int* rc) {
  std::lock_guard lock(s->obj_mu);
  const auto it = table.find(handle);
  if (it != table.end()) return it->second;
  *rc = fail(HMC_PROV_ERR_INVALID, "%s: %p is not a live %s of this provider", what, handle, kind);
  return nullptr;
}

}  // namespace

uint64_t Channel::ticket() {
  std::lock_guard lock(mu_);
  return next_++;
}

bool Channel::wait_turn(uint64_t t, const std::function<bool()>& stop) {
  std::unique_lock lock(mu_);
  while (head_ != t) {
    if (stop) {
      // Not under mu_: `stop` takes the stream's lock, which submit holds around ticket().
      lock.unlock();
      if (stop()) return false;
      lock.lock();
      if (head_ == t) break;
    }
    cv_.wait_for(lock, kMaxPoll);
  }
  return true;
}

void Channel::done(uint64_t t) {
  {
    std::lock_guard lock(mu_);
    finished_.insert(t);
    while (!finished_.empty() && *finished_.begin() == head_) {
      finished_.erase(finished_.begin());
      ++head_;
    }
  }
  cv_.notify_all();
}

std::shared_ptr<Channel> channel_for(State* s, int device, bool this_thread) {
  if (s->queues == 0 || device < 0 || device >= static_cast<int>(s->channels.size())) return nullptr;
  std::lock_guard lock(s->obj_mu);
  auto& queues = s->channels[device];
  const std::size_t i = this_thread ? std::hash<std::thread::id>{}(std::this_thread::get_id()) % queues.size()
                                    : s->next_channel[device]++ % queues.size();
  return queues[i];
}

int queue_device(const State* s, std::initializer_list<const void*> pointers) {
  int imported = -1;
  for (const void* p : pointers) {
    const int w = window_of(s, p);
    if (w >= 0 && w < s->devices) return w;
    if (w == s->devices) imported = 0;
  }
  return imported;
}

Stream::Stream(State* s, int device) : s_(s), device_(device), channel_(channel_for(s, device, false)) {
  thread_ = std::thread([this] { worker(); });
}

Stream::~Stream() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int Stream::submit(Op op) {
  std::lock_guard lock(mu_);
  if (error_ != 0) return fail(error_, "%s", error_text_.c_str());
  if (channel_) op.ticket = channel_->ticket();
  queue_.push_back(std::move(op));
  cv_.notify_all();
  return HMC_PROV_OK;
}

int Stream::query() {
  std::lock_guard lock(mu_);
  if (error_ != 0) return fail(error_, "%s", error_text_.c_str());
  return busy_ || !queue_.empty() ? HMC_PROV_IN_PROGRESS : HMC_PROV_OK;
}

void Stream::fail_with(int code, const std::string& text) {
  std::lock_guard lock(mu_);
  if (error_ == 0) {
    error_ = code;
    error_text_ = text;
  }
}

// Polls `ready` with growing sleeps; the sleep ends early when the stream stops.
bool Stream::wait_ready(const Op& op) {
  auto poll = std::chrono::duration_cast<Clock::duration>(kMinPoll);
  while (op.ready && !op.ready()) {
    std::unique_lock lock(mu_);
    if (stopping_) return false;
    cv_.wait_for(lock, poll, [this] { return stopping_; });
    poll = std::min<Clock::duration>(poll * 2, kMaxPoll);
  }
  return true;
}

void Stream::worker() {
  for (;;) {
    Op op;
    bool failed = false;
    std::string why;  // the stream's error, once failed
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and idle
      op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      failed = error_ != 0;
      if (failed) why = error_text_;
    }
    // Its turn in the hardware queue first: a stream being destroyed gives up waiting.
    const bool turn = failed || !channel_ || channel_->wait_turn(op.ticket, [this] {
      std::lock_guard lock(mu_);
      return stopping_;
    });
    if (!failed && turn && s_->delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(s_->delay_us));
    }
    if (failed) {
      if (op.drop) op.drop(why);
    } else if (!turn || !wait_ready(op)) {
      why = "stream destroyed while waiting: its queued work was dropped";
      if (op.drop) op.drop(why);
      fail_with(HMC_PROV_ERR_CLOSED, why);
      log(s_, HMC_LOG_DEBUG, "stream of device %d destroyed while waiting; dropping its queue",
          device_);
    } else if (s_->fail_op != 0 && ++s_->stream_ops == s_->fail_op) {
      why = "injected failure of stream operation " + std::to_string(s_->fail_op) + " (HMC_EMU_FAIL_STREAM_OP)";
      if (op.drop) op.drop(why);
      fail_with(HMC_PROV_ERR_INTERNAL, why);
    } else if (const int rc = op.run ? op.run() : HMC_PROV_OK; rc != HMC_PROV_OK) {
      fail_with(rc, last_error_text());
      log(s_, HMC_LOG_WARN, "stream of device %d failed: %s", device_, last_error_text());
    }
    if (channel_) channel_->done(op.ticket);
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    if (s_->stream_wake) wake(s_);
  }
}

int submit(State* s, const char* what, void* stream, Op op, int device) {
  if (stream == nullptr) {  // synchronous, on the caller, in its turn of the thread's queue
    const auto channel = channel_for(s, device, true);
    const uint64_t t = channel ? channel->ticket() : 0;
    if (channel) channel->wait_turn(t, nullptr);
    auto poll = std::chrono::duration_cast<Clock::duration>(kMinPoll);
    while (op.ready && !op.ready()) {
      std::this_thread::sleep_for(poll);
      poll = std::min<Clock::duration>(poll * 2, kMaxPoll);
    }
    const int rc = op.run ? op.run() : HMC_PROV_OK;
    if (channel) channel->done(t);
    return rc;
  }
  int rc = HMC_PROV_OK;
  const auto st = find(s, s->streams, stream, what, "stream", &rc);
  return st ? st->submit(std::move(op)) : rc;
}

// ---- streams ------------------------------------------------------------------------

int stream_create(void* state, int device, void** stream) {
  auto* s = static_cast<State*>(state);
  if (stream == nullptr) return fail(HMC_PROV_ERR_INVALID, "stream_create: null output pointer");
  *stream = nullptr;
  if (const int rc = check_device(s, "stream_create", device); rc != HMC_PROV_OK) return rc;
  try {
    auto st = std::make_shared<Stream>(s, device);
    std::lock_guard lock(s->obj_mu);
    s->streams.emplace(st.get(), st);
    *stream = st.get();
  } catch (const std::exception& e) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "stream_create: %s", e.what());
  }
  return HMC_PROV_OK;
}

int stream_destroy(void* state, void* stream) {
  auto* s = static_cast<State*>(state);
  std::shared_ptr<Stream> st;
  {
    std::lock_guard lock(s->obj_mu);
    const auto it = s->streams.find(stream);
    if (it == s->streams.end()) {
      return fail(HMC_PROV_ERR_INVALID, "stream_destroy: %p is not a live stream of this provider",
                  stream);
    }
    st = std::move(it->second);
    s->streams.erase(it);
  }
  st.reset();  // joins the worker, outside obj_mu (a submit may hold a reference a while)
  return HMC_PROV_OK;
}

int wait_device_idle(State* s, const char* what) {
  if (!s->device_wide_frees) return HMC_PROV_OK;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    std::vector<std::shared_ptr<Stream>> all;
    {
      std::lock_guard lock(s->obj_mu);
      for (const auto& [handle, st] : s->streams) all.push_back(st);
    }
    // A failed stream runs nothing more: it counts as idle.
    if (std::none_of(all.begin(), all.end(), [](const auto& st) { return st->query() == HMC_PROV_IN_PROGRESS; }))
      return HMC_PROV_OK;
    if (std::chrono::steady_clock::now() > until) {
      note(s, "device-wide-wait-stuck", 1);
      return fail(HMC_PROV_ERR_INTERNAL, "%s: a stream still had work queued after 5 s: a device-wide wait would "
                  "never have returned", what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int stream_query(void* state, void* stream) {
  auto* s = static_cast<State*>(state);
  if (stream == nullptr) return HMC_PROV_OK;  // the synchronous stream is always idle
  int rc = HMC_PROV_OK;
  const auto st = find(s, s->streams, stream, "stream_query", "stream", &rc);
  return st ? st->query() : rc;
}

// ---- events ---------------------------------------------------------------------------

int event_create(void* state, int device, void** event) {
  auto* s = static_cast<State*>(state);
  if (event == nullptr) return fail(HMC_PROV_ERR_INVALID, "event_create: null output pointer");
  *event = nullptr;
  if (const int rc = check_device(s, "event_create", device); rc != HMC_PROV_OK) return rc;
  try {
    auto ev = std::make_shared<Event>();
    ev->device = device;
    std::lock_guard lock(s->obj_mu);
    s->events.emplace(ev.get(), ev);
    *event = ev.get();
  } catch (const std::bad_alloc&) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "event_create: out of memory");
  }
  return HMC_PROV_OK;
}

int event_destroy(void* state, void* event) {
  auto* s = static_cast<State*>(state);
  std::lock_guard lock(s->obj_mu);
  if (s->events.erase(event) == 0) {
    return fail(HMC_PROV_ERR_INVALID, "event_destroy: %p is not a live event of this provider", event);
  }
  return HMC_PROV_OK;  // queued records and waits hold their own reference
}

int event_record(void* state, void* event, void* stream) {
  auto* s = static_cast<State*>(state);
  int rc = HMC_PROV_OK;
  const auto ev = find(s, s->events, event, "event_record", "event", &rc);
  if (!ev) return rc;
  const uint64_t gen = ev->recorded.fetch_add(1) + 1;
  Op op;
  op.run = [ev, gen] { return raise_to(ev->reached, gen), HMC_PROV_OK; };
  op.drop = [ev, gen](const std::string& why) {
    {
      std::lock_guard lock(ev->mu);
      ev->why = why;
    }
    raise_to(ev->failed, gen);
  };
  rc = submit(s, "event_record", stream, std::move(op));
  if (rc != HMC_PROV_OK) raise_to(ev->failed, gen);  // never reached: do not leave it pending
  return rc;
}

int event_query(void* state, void* event) {
  auto* s = static_cast<State*>(state);
  int rc = HMC_PROV_OK;
  const auto ev = find(s, s->events, event, "event_query", "event", &rc);
  if (!ev) return rc;
  const uint64_t gen = ev->recorded.load();
  if (ev->reached.load() >= gen) return HMC_PROV_OK;  // also: never recorded
  if (ev->failed.load() >= gen) {
    std::lock_guard lock(ev->mu);
    return fail(HMC_PROV_ERR_CLOSED, "event_query: the stream it was recorded on failed before reaching it: %s",
                ev->why.empty() ? "it was destroyed" : ev->why.c_str());
  }
  // A host preempted right after the look: the answer is old when it arrives, and later
  // work of the same stream may have ended meanwhile.
  if (s->query_lag_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(s->query_lag_us));
  return HMC_PROV_IN_PROGRESS;
}

int stream_wait_event(void* state, void* stream, void* event) {
  auto* s = static_cast<State*>(state);
  int rc = HMC_PROV_OK;
  const auto ev = find(s, s->events, event, "stream_wait_event", "event", &rc);
  if (!ev) return rc;
  const uint64_t gen = ev->recorded.load();
  Op op;
  op.ready = [ev, gen] { return ev->reached.load() >= gen || ev->failed.load() >= gen; };
  op.run = [ev, gen] {
    if (ev->reached.load() >= gen) return HMC_PROV_OK;
    return fail(HMC_PROV_ERR_CLOSED, "stream_wait_event: the awaited event's stream was "
                                     "destroyed or failed before reaching it");
  };
  return submit(s, "stream_wait_event", stream, std::move(op));
}

// ---- flags ----------------------------------------------------------------------------

int flag_alloc(void* state, int device, volatile uint32_t** flag) {
  auto* s = static_cast<State*>(state);
  if (flag == nullptr) return fail(HMC_PROV_ERR_INVALID, "flag_alloc: null output pointer");
  *flag = nullptr;
  if (const int rc = check_device(s, "flag_alloc", device); rc != HMC_PROV_OK) return rc;
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  try {
    auto word = std::make_shared<std::atomic<uint32_t>>(0);
    std::lock_guard lock(s->obj_mu);
    s->flags.emplace(word.get(), word);
    *flag = reinterpret_cast<volatile uint32_t*>(word.get());
  } catch (const std::bad_alloc&) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "flag_alloc: out of memory");
  }
  return HMC_PROV_OK;
}

int flag_free(void* state, volatile uint32_t* flag) {
  auto* s = static_cast<State*>(state);
  const void* key = const_cast<const uint32_t*>(flag);
  std::lock_guard lock(s->obj_mu);
  if (s->flags.erase(key) == 0) {
    return fail(HMC_PROV_ERR_INVALID, "flag_free: %p is not a live flag of this provider", key);
  }
  return HMC_PROV_OK;  // a queued wait keeps the word until it is done with it
}

// Only words from flag_alloc: a device would need other host memory registered first.
int stream_wait_flag(void* state, void* stream, volatile uint32_t* flag, uint32_t value) {
  auto* s = static_cast<State*>(state);
  const void* key = const_cast<const uint32_t*>(flag);
  std::shared_ptr<std::atomic<uint32_t>> word;
  {
    std::lock_guard lock(s->obj_mu);
    const auto it = s->flags.find(key);
    if (it == s->flags.end()) {
      return fail(HMC_PROV_ERR_INVALID, "stream_wait_flag: %p is not a live flag from flag_alloc", key);
    }
    word = it->second;
  }
  Op op;
  op.ready = [word, value] { return word->load(std::memory_order_acquire) >= value; };
  return submit(s, "stream_wait_flag", stream, std::move(op));
}

Leftovers release_objects(State* s) {
  std::map<const void*, std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lock(s->obj_mu);
    streams.swap(s->streams);
  }
  Leftovers n;
  n.streams = streams.size();
  streams.clear();  // joins the workers
  std::lock_guard lock(s->obj_mu);
  n.events = s->events.size();
  n.flags = s->flags.size();
  s->events.clear();
  s->flags.clear();
  return n;
}

}  // namespace hmc::emu
