#include "core/progress.h"

#include <pthread.h>

#include <algorithm>
#include <memory>
#include <string_view>
#include <thread>

#include "core/host_segments.h"

namespace hmc::core {
namespace {

// An allocator that keeps up to kKeep freed single objects per thread and hands them
// out again. Blocks move between threads freely (an operation made on the caller's
// thread may die on another); all come from and return to the global operator new.
// After a thread's cache is gone (thread exit), that thread uses the heap directly.
template <class T>
class Recycling {
 public:
  using value_type = T;
  Recycling() = default;
  template <class U>
  Recycling(const Recycling<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) {
    Cache* c = cache();
    if (n == 1 && c && c->n > 0) return static_cast<T*>(c->blocks[--c->n]);
    return std::allocator<T>{}.allocate(n);
  }
  void deallocate(T* p, std::size_t n) {
    Cache* c = cache();
    if (n == 1 && c && c->n < kKeep) {
      c->blocks[c->n++] = p;
      return;
    }
    std::allocator<T>{}.deallocate(p, n);
  }
  template <class U>
  bool operator==(const Recycling<U>&) const { return true; }

 private:
  static constexpr int kKeep = 64;
  struct Cache {
    void* blocks[kKeep];
    int n = 0;
    ~Cache() {
      for (int i = 0; i < n; ++i) std::allocator<T>{}.deallocate(static_cast<T*>(blocks[i]), 1);
      n = 0;
      gone() = true;
    }
  };
  static bool& gone() {
    thread_local bool g = false;  // trivially destructible: readable after Cache died
    return g;
  }
  static Cache* cache() {
    if (gone()) return nullptr;
    thread_local Cache c;
    return &c;
  }
};

// Bumped (under the changing engine's mu_) whenever any engine's list changes: a thread's
// copy of a list is current while this has not moved. One count for every engine, so an
// engine made where a destroyed one was never inherits its copy.
std::atomic<uint64_t> list_changes{1};

// What progress() keeps per thread, in one thread_local: in a shared library each one
// costs a call to find it, and a waiter polls back to back.
struct PassState {
  // The engines this thread runs a counted pass of, innermost last (ProgressEngine::remove).
  std::vector<const ProgressEngine*> passes;
  // The copy of an engine's list that the outermost pass reuses (ProgressEngine::progress).
  std::vector<Progressable*> reused;
  const ProgressEngine* reused_of = nullptr;
  uint64_t reused_at = 0;
  int depth = 0;
  unsigned light_passes = 0;
};

PassState& pass_state() {
  thread_local PassState t;
  return t;
}

bool in_pass_of(const PassState& t, const ProgressEngine* e) {
  return std::find(t.passes.begin(), t.passes.end(), e) != t.passes.end();
}

// The first sleep after polls close together where some provider has no idle
// (progress.h); longer than the gap net-providers/common/msg_ring.h takes for a reader
// that stopped polling.
constexpr std::chrono::microseconds kQuietTime{200};
// A 512 KiB round of a collective over shared segments takes a peer 40-100 us to copy here;
// sleeping after 1600 polls (about 80 us) made a 2 MiB all_gather bimodal, 150 or 700 us.
constexpr std::chrono::microseconds kSegmentSpin{1000};
// A sleep on a segment's bell: every write a waiter waits for rings it, so this only
// bounds what a lost ring could cost.
constexpr std::chrono::microseconds kBellSlice{20000};
}  // namespace

void ProgressEngine::segment_waits(int delta, const std::shared_ptr<HostSegments>& segs) {
  segment_waits_.fetch_add(delta, std::memory_order_relaxed);
  // Every collective passes here twice, so only a count that crosses zero takes mu_; the
  // list then follows the count as it stands, which settles two crossings from different
  // threads whichever locks last.
  const int now = segs->count_pending(delta);
  if (now != (delta > 0 ? delta : 0)) return;
  std::lock_guard lock(mu_);
  auto it = std::find(bells_.begin(), bells_.end(), segs);
  if (segs->pending() && it == bells_.end()) bells_.push_back(segs);
  else if (!segs->pending() && it != bells_.end()) bells_.erase(it);
}

std::shared_ptr<HostSegments> ProgressEngine::single_bell() const {
  return bells_.size() == 1 ? bells_.front() : nullptr;
}

void ProgressEngine::add(Progressable* p) {
  std::lock_guard lock(mu_);
  items_.push_back(p);
  list_changes.fetch_add(1, std::memory_order_release);
}

void ProgressEngine::remove(Progressable* p) {
  {
    std::lock_guard lock(mu_);
    items_.erase(std::remove(items_.begin(), items_.end(), p), items_.end());
    list_changes.fetch_add(1);
  }
  // A pass on another thread that copied the list before the erase may still call p: wait
  // for every pass counted under the parity before the flip, so the caller may free p once
  // this returns. Passes that start later see the new list. Not from inside a pass of this
  // engine (an item that removes itself, collectives/driver.cpp): it would wait for itself,
  // and such an item outlives its own call anyway.
  if (in_pass_of(pass_state(), this)) return;
  std::lock_guard serial(remove_mu_);
  const auto parity = static_cast<std::size_t>(epoch_.fetch_add(1) & 1);
  while (passes_[parity].load() > 0) std::this_thread::yield();
}

void ProgressEngine::add_poller(std::function<bool()> poll, std::function<void()> idle) {
  std::lock_guard lock(mu_);
  pollers_.push_back(std::move(poll));
  if (idle) idlers_.push_back(std::move(idle));
}

bool ProgressEngine::pass_after_idle() { return pass(true, true); }

bool ProgressEngine::pass(bool all_pollers, bool idle_first) {
  // Copy under the lock, run without it: a communicator's progress may take a while.
  // The copy is this thread's, kept while no engine's list changed (waiters call this in
  // a tight loop, and the list changes only when communicators come and go), unless this
  // call is nested in another.
  PassState& t = pass_state();
  std::vector<Progressable*> nested;
  std::vector<Progressable*>& items = t.depth == 0 ? t.reused : nested;
  // only appended to during Context creation, before any wait
  std::vector<std::function<bool()>>* pollers = &pollers_;
  // Counted as a pass before the list is read, for remove() to wait on (seq_cst: a pass
  // that counts under the old parity is waited for; one that saw the flip sees the erase).
  struct Counted {
    ProgressEngine* e;
    PassState& t;
    std::size_t parity = 0;
    bool outer;
    Counted(ProgressEngine* engine, PassState& state) : e(engine), t(state), outer(!in_pass_of(state, engine)) {
      if (!outer) return;
      for (;;) {
        const uint64_t epoch = e->epoch_.load();
        parity = static_cast<std::size_t>(epoch & 1);
        e->passes_[parity].fetch_add(1);
        if (e->epoch_.load() == epoch) break;
        e->passes_[parity].fetch_sub(1);
      }
      t.passes.push_back(e);
    }
    ~Counted() {
      if (!outer) return;
      t.passes.pop_back();
      e->passes_[parity].fetch_sub(1);
    }
  } counted(this, t);
  // Counted, then the flag (both seq_cst): either close() waits for this pass, or this pass
  // sees the engine closed and touches nothing, since the pollers' providers may be gone.
  if (closed_.load()) return false;
  // The idlers too run inside the counted pass: they reach into the providers' states.
  if (idle_first)
    for (auto& idle : idlers_) idle();
  const uint64_t now = list_changes.load();
  if (t.depth > 0 || t.reused_of != this || t.reused_at != now) {
    std::lock_guard lock(mu_);
    items.assign(items_.begin(), items_.end());
    if (t.depth == 0) {
      t.reused_of = this;
      t.reused_at = list_changes.load(std::memory_order_relaxed);
    }
  }
  ++t.depth;
  bool any = false;
  // While shared-segment collectives are pending their waiters poll as fast as they can;
  // the providers' pollers (a UCX worker's progress among them) run on every 16th pass.
  const bool light =
      !all_pollers && segment_waits_.load(std::memory_order_relaxed) > 0 && ++t.light_passes % 16 != 0;
  if (!light)
    for (auto& poll : *pollers) any |= poll();
  for (Progressable* p : items) any |= p->progress();
  --t.depth;
  return any;
}

void ProgressEngine::wake() {
  wakes_.fetch_add(1, std::memory_order_release);
  if (sleepers_.load(std::memory_order_acquire) > 0) {
    std::lock_guard lock(mu_);
    cv_.notify_all();
    if (bell_sleepers_ > 0)
      for (auto& segs : bells_) segs->ring_own();
  }
}

bool ProgressEngine::wait_until(const std::function<bool()>& done, Clock::time_point deadline) {
  constexpr int kSpins = 200;  // yields before the first sleep
  int idle = 0;
  Clock::time_point last_poll{}, idle_since{};
  while (true) {
    uint64_t seen = wakes_.load(std::memory_order_acquire);
    bool moved = progress();
    if (done()) return true;
    if (closed_) return done();
    auto now = Clock::now();
    // Polls close together may have told providers that this thread is polling (see
    // progress.h): before the sleep after them they are told it stops (or, where one
    // cannot be told, that sleep is short and the poll after it is not).
    const bool polling = now - last_poll < kQuietTime;
    last_poll = now;
    if (now >= deadline) return false;
    if (moved) { idle = 0; continue; }
    // Nothing wakes a wait on shared segments (peers only write memory): it polls for
    // kSegmentSpin before it sleeps, not only for kSpins polls.
    const bool segments = segment_waits_.load(std::memory_order_relaxed) > 0;
    const int every = (segments ? yield_every_ : message_yield_every_).load(std::memory_order_relaxed);
    if (idle++ == 0) idle_since = now;
    if (idle < kSpins * every || (segments && now - idle_since < kSegmentSpin)) {
      if (idle % every == 0) std::this_thread::yield();
      continue;
    }
    // A waiter that was polling tells the providers it stops, where all can be told; its
    // one pass after that is the pass that finds what arrived before it sleeps. Else its
    // first sleep is short (progress.h).
    const bool tell = polling && idlers_.size() == pollers_.size();
    const bool quiet = polling && !tell;
    std::unique_lock lock(mu_);
    sleepers_.fetch_add(1);
    if (auto bell = segments ? single_bell() : nullptr) {
      ++bell_sleepers_;
      lock.unlock();
      const auto slice = std::min<Clock::duration>(deadline - now, quiet ? kQuietTime : kBellSlice);
      const uint32_t rung = bell->begin_sleep();
      // Once more, now that peers and wake() ring: what arrived before is seen here.
      const bool moved = tell ? pass_after_idle() : progress();
      if (!moved && !done() && !closed_ && wakes_.load(std::memory_order_acquire) == seen)
        bell->sleep(rung, std::chrono::duration_cast<std::chrono::microseconds>(slice));
      bell->end_sleep();
      lock.lock();
      --bell_sleepers_;
    } else {
      bool found = false;
      if (tell) {
        lock.unlock();  // a pass may take mu_
        found = pass_after_idle() || done();
        lock.lock();
      }
      auto until = std::min(deadline, now + (quiet ? kQuietTime : std::chrono::milliseconds(1)));
      if (!found) cv_.wait_until(lock, until, [&] { return wakes_.load(std::memory_order_acquire) != seen; });
    }
    sleepers_.fetch_sub(1);
  }
}

void ProgressEngine::close() {
  closed_ = true;
  {
    std::lock_guard lock(mu_);
    cv_.notify_all();
  }
  wake();
  if (background_.joinable() && background_.get_id() != std::this_thread::get_id()) background_.join();
  // The context frees its providers next: a pass another thread began before the flag was
  // set (a waiter that a communicator's abort woke) must be over first. Not from inside a
  // pass of this engine, which would wait for itself.
  if (in_pass_of(pass_state(), this)) return;
  while (passes_[0].load() + passes_[1].load() > 0) std::this_thread::yield();
}

ProgressEngine::~ProgressEngine() {
  closed_ = true;
  {
    std::lock_guard lock(mu_);
    cv_.notify_all();
  }
  if (background_.joinable()) {
    if (background_.get_id() == std::this_thread::get_id()) background_.detach();
    else background_.join();
  }
}

void ProgressEngine::hold() {
  std::lock_guard lock(mu_);
  ++holds_;
  if (!background_.joinable() && !closed_) background_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hmc-progress");
    background_loop();
  });
  cv_.notify_all();
}

void ProgressEngine::release() {
  std::lock_guard lock(mu_);
  --holds_;
}

bool ProgressEngine::held() {
  std::lock_guard lock(mu_);
  return holds_ > 0;
}

void ProgressEngine::background_loop() {
  int idle = 0;
  while (!closed_) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return holds_ > 0 || closed_; });
    }
    if (closed_) return;
    // Busy while work moves, then yields, then naps: a pending stream operation may wait
    // on a peer for a long time.
    if (progress()) idle = 0;
    else if (++idle < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::shared_ptr<Operation> Operation::make(std::shared_ptr<ProgressEngine> engine) {
  return std::allocate_shared<Operation>(Recycling<Operation>{}, std::move(engine));
}

std::shared_ptr<Operation> Operation::failed(Status s) {
  auto op = make(nullptr);
  op->fail(std::move(s));
  return op;
}

void Operation::complete(std::size_t bytes) {
  if (claimed_.exchange(true)) return;
  bytes_ = bytes;
  state_.store(kDone, std::memory_order_release);
  if (engine_) engine_->wake();
}

void Operation::fail(Status s) {
  if (claimed_.exchange(true)) return;
  status_ = std::move(s);
  state_.store(kFailed, std::memory_order_release);
  if (engine_) engine_->wake();
}

std::string Operation::describe() const {
  if (what.name == nullptr) return "";
  std::string text = std::string(what.name) + " of " + std::to_string(what.bytes) + " bytes";
  if (what.peer < 0) return text;
  const std::string_view name(what.name);
  text += (name == "receive" ? " from rank " : " to rank ") + std::to_string(what.peer);
  return name == "put" ? text : text + " (tag " + std::to_string(what.tag) + ")";
}

Status Operation::status() const {
  if (state_.load(std::memory_order_acquire) == kFailed) return status_;
  return {};
}

}  // namespace hmc::core
