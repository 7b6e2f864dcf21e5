// ProgressEngine and Operation: how completions reach Request::wait.
//
// Provider threads never call user code: they complete their own requests and call
// host->wake(). Core state machines (tag matching, rendezvous) advance inside HMC calls:
// every wait/test runs ProgressEngine::progress(), which polls every registered
// Progressable (communicators) once. Waiters spin briefly, then sleep on a condition
// variable until a wake or 1 ms passes (on a segment's bell while collectives over shared
// segments are pending: below).
//
// A provider may take calls to its `progress` that come close together as a caller that
// is polling, and wake the host only for what arrives otherwise: shm's message rings do
// (net-providers/common/msg_ring.h), and ucx's thread leaves the worker to such a caller.
// A waiter whose last two polls came close together therefore tells every provider, with
// its `idle` (net.h), that it stops polling, and makes exactly one pass after that (what
// arrived before is found there, and the provider does not take that call as close to
// the last) before it sleeps; from then on the providers wake it. Where some provider
// has no `idle`, such a waiter instead sleeps at most kQuietTime (progress.cpp), then
// polls again, before any longer sleep: a message that lands just as it goes to sleep is
// then seen after up to kQuietTime (rounds of 250-385 us in ucx's timing test on CI).
//
// Device work in flight (a stream copy or a delegated collective whose event has not
// passed) counts as a productive poll: its end wakes nobody (CUDA calls no host->wake), so
// a waiter keeps polling its event, as cudaStreamSynchronize would, rather than sleep.
//
// A waiter yields the CPU (sched_yield) after every message_yield_every-th unproductive
// poll, polling back to back in between; while a collective over shared segments is
// pending (collectives/shm_coll.h: its peers write straight into shared memory, no io
// thread involved), after every yield_every-th one. ContextImpl::note_host_ranks sets both:
// 8 while this host's ranks have a CPU each, and for messages over providers that need a
// thread of their own (tcp's and shm's io threads; not ucx, HMC_NET_CAP_POLLED) a second
// CPU each for it, else 1. A poll is a fraction of a microsecond and a yield 0.6 us or
// more. With 2 ranks on 2 vCPUs, polling 8 times between yields delayed the io threads
// that carry bells (2-rank 8-byte sendrecv 1.8 -> 2.7 us; shm's 8 B half round trip
// 1.3-1.6 -> 1.6-2.0 us); on 16 cores it took ucx's from 1.5-1.7 to 1.0-1.4 us, and on 2
// vCPUs from 1.11-1.37 to 0.98-1.30 (docs/performance.md, "Message waits with CPUs to
// spare").
// While such a collective is pending a waiter also polls for kSegmentSpin (1 ms) before
// it sleeps, and progress() runs the providers' pollers on every 16th pass only. Its
// sleep is then on the segment's bell, a futex that the peers ring when they write, in
// slices of up to kBellSlice; with collectives of several communicators pending, on the
// condition variable for up to 1 ms at a time, as no single bell covers them.
//
// Lock order: Progressable's own mutex (taken with try_lock by progress) before
// ProgressEngine::mu_ (held only to copy the list or to sleep).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hmc/request.h"
#include "hmc/status.h"

namespace hmc::core {

class HostSegments;

class Progressable {
 public:
  virtual ~Progressable() = default;
  // Advances what it can without blocking; returns true when something happened.
  virtual bool progress() = 0;
};

class ProgressEngine {
 public:
  void add(Progressable* p);
  // Takes p off the list and waits until no pass on another thread can still call it
  // (then p may be freed). Never call it holding a lock that an item's progress() may
  // block on: a pass in flight would wait for it.
  void remove(Progressable* p);
  // Extra pollers (net providers' progress functions) run on every pass. `idle`, where
  // the provider has one (net.h), tells it that the caller stops polling.
  void add_poller(std::function<bool()> poll, std::function<void()> idle = {});
  bool progress() { return pass(false); }
  void wake();
  // Runs progress until done() or the deadline; false on deadline.
  bool wait_until(const std::function<bool()>& done, Clock::time_point deadline);
  // Closes the engine: waiters return, the background thread (if any) ends, and once it
  // returns no pass runs a poller or an item any more (passes in flight are waited for).
  void close();
  // While held, a background thread drives progress: stream-ordered operations must
  // complete even when nobody waits on them (core/stream_order.h).
  void hold();
  void release();
  // Whether any hold is in place: a stream then waits on a flag that progress sets.
  bool held();
  ~ProgressEngine();
  // HMC_TIMEOUT, for Request::wait() without an argument.
  std::chrono::milliseconds default_timeout{60000};
  void set_yield_every(int polls) { yield_every_.store(polls < 1 ? 1 : polls, std::memory_order_relaxed); }
  void set_message_yield_every(int polls) {
    message_yield_every_.store(polls < 1 ? 1 : polls, std::memory_order_relaxed);
  }
  int yield_every() const { return yield_every_.load(std::memory_order_relaxed); }
  int message_yield_every() const { return message_yield_every_.load(std::memory_order_relaxed); }
  // A shared-segment collective over `segs` starts (+1) or ends (-1). While only one
  // communicator's are pending, a waiter sleeps on that segment's bell, which its peers
  // ring when they write (host_segments.h), and wake() rings it too.
  void segment_waits(int delta, const std::shared_ptr<HostSegments>& segs);
  bool closed() const { return closed_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Progressable*> items_;
  // Passes in flight by the parity of epoch_ they began under; remove() flips epoch_ and
  // waits for the old parity to drain (one remove at a time: remove_mu_).
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> passes_[2] = {0, 0};
  std::mutex remove_mu_;
  std::vector<std::function<bool()>> pollers_;
  std::vector<std::function<void()>> idlers_;  // one per poller that came with an idle
  std::atomic<uint64_t> wakes_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> closed_{false};
  std::atomic<int> yield_every_{1};
  std::atomic<int> message_yield_every_{1};
  std::atomic<int> segment_waits_{0};
  int holds_ = 0;  // guarded by mu_
  // Segments with collectives pending (guarded by mu_), and how many waiters sleep on a
  // bell rather than on cv_ (guarded by mu_).
  std::vector<std::shared_ptr<HostSegments>> bells_;
  int bell_sleepers_ = 0;
  std::shared_ptr<HostSegments> single_bell() const;  // with mu_ held
  // A pass; with `all_pollers` it runs the pollers even where a light pass would not,
  // with `idle_first` it tells the idlers first (counted as part of the pass, so that
  // close() waits for them too).
  bool pass(bool all_pollers, bool idle_first = false);
  // Tells every poller that the caller stops polling, then makes the one pass after it.
  bool pass_after_idle();
  std::thread background_;
  void background_loop();
};

// `now + d`, saturated: a timeout too long to add to the clock (milliseconds::max(), a
// common way to say "forever") waits without end instead of overflowing into the past and
// timing out at once. A negative one has passed already.
template <class Rep, class Period>
Clock::time_point deadline_after(std::chrono::duration<Rep, Period> d, Clock::time_point now = Clock::now()) {
  if (d <= d.zero()) return now;
  const auto room = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(Clock::time_point::max() - now);
  if (d >= room) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(d);
}

// The shared state of one non-blocking operation.
class Operation {
 public:
  explicit Operation(std::shared_ptr<ProgressEngine> engine) : engine_(std::move(engine)) {}
  static std::shared_ptr<Operation> failed(Status s);
  // A new pending operation. Its memory comes from a small per-thread cache of freed
  // operations (progress.cpp): every send, receive and collective makes one.
  static std::shared_ptr<Operation> make(std::shared_ptr<ProgressEngine> engine);

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  // Completion and failure are idempotent: the first one wins.
  void complete(std::size_t bytes);
  void fail(Status s);
  Status status() const;
  std::size_t bytes() const { return bytes_; }
  ProgressEngine* engine() const { return engine_.get(); }

  // Number of sub-steps still to finish before complete() (e.g. put + FIN message).
  int pending_parts = 0;

  // What the operation is, for the message of a wait that times out (set where it is made;
  // formatted only then): "send", "receive", "put" with a peer, or a collective's name.
  struct What {
    const char* name = nullptr;
    int peer = -1;
    uint64_t tag = 0;
    std::size_t bytes = 0;
  };
  What what;
  // "receive of 64 bytes from rank 1 (tag 7)", "all_reduce of 4096 bytes"; "" when unset.
  std::string describe() const;

 private:
  static constexpr int kPending = 0, kDone = 1, kFailed = 2;
  std::shared_ptr<ProgressEngine> engine_;
  std::atomic<int> state_{kPending};
  std::atomic<bool> claimed_{false};
  std::size_t bytes_ = 0;
  Status status_;
};

}  // namespace hmc::core
