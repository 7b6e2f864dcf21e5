// Streams of the emulated device: one worker thread per stream runs queued operations
// in order, each after HMC_EMU_STREAM_DELAY_US; waits (events, flags) hold the queue
// until they are satisfied, checking with short sleeps.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
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
};

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
// (waiting for `ready` first). A stream that is not one of this provider's is INVALID.
int submit(State* s, const char* what, void* stream, Op op);

}  // namespace hmc::emu
