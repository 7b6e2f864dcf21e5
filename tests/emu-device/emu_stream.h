// Streams of the emulated device: one worker thread per stream runs queued operations
// in order, each after HMC_EMU_STREAM_DELAY_US; waits (events, flags) hold the queue
// until they are satisfied, checking with short sleeps.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "emu_state.h"

namespace hmc::emu {

// One queued operation. `ready` (a wait) is polled until true before `run`; `run`
// returns 0 or an HMC_PROV_ERR_* with last_error set; `drop` is called instead of
// both when the operation will never run (its stream was destroyed or failed).
struct Op {
  std::function<bool()> ready;
  std::function<int()> run;
  std::function<void(const std::string& why)> drop;
  uint64_t ticket = 0;  // its place in the stream's hardware queue, if it has one
};

// A hardware queue that several streams share (HMC_EMU_QUEUES, like CUDA's
// CUDA_DEVICE_MAX_CONNECTIONS): operations run in the order they were submitted, across
// its streams, and a wait at the head holds every operation behind it, whatever its
// stream. A GPU overlaps independent kernels of one queue; the emulator runs them one by
// one, which changes no order a program may rely on.
class Channel {
 public:
  // The next place; taken at submission, under the submitting stream's lock.
  uint64_t ticket();
  // Blocks until `t` is at the head, or `stop` (polled) says to give up: false then.
  bool wait_turn(uint64_t t, const std::function<bool()>& stop);
  // `t` ran or was dropped: the next may go.
  void done(uint64_t t);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;
  uint64_t head_ = 0;
  std::set<uint64_t> finished_;  // done, but behind an operation that is not
};

// The queue for a new stream of `device` (round robin), or for the calling thread's
// synchronous work (stream NULL, like CUDA's per-thread stream); null when queues are
// not limited.
std::shared_ptr<Channel> channel_for(State* s, int device, bool this_thread);

class Stream {
 public:
  Stream(State* s, int device);
  // Runs the queued work that can run, drops the rest from the first wait that is
  // not satisfied, and joins the worker: never blocks on a flag or event.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int submit(Op op);
  // 0 idle, 1 pending, or the error that failed the stream (last_error set).
  int query();

 private:
  void worker();
  bool wait_ready(const Op& op);
  void fail_with(int code, const std::string& text);

  State* s_;
  int device_;
  std::shared_ptr<Channel> channel_;  // null: a queue of its own
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  int error_ = 0;  // sticky: a failed stream drops all later work
  std::string error_text_;
  std::thread thread_;
};

// Queues `op` on `stream`, or runs it on the calling thread when stream is NULL
// (waiting for `ready` first; with HMC_EMU_QUEUES, for its turn in the calling thread's
// queue of `device` too: -1 is host memory only, no queue). A stream that is not one of
// this provider's is INVALID.
int submit(State* s, const char* what, void* stream, Op op, int device = -1);
// The device whose queue synchronous work on these pointers takes: the first in device
// memory, 0 for memory imported from another process, -1 when all are host memory.
int queue_device(const State* s, std::initializer_list<const void*> pointers);

}  // namespace hmc::emu
