// Host staging of a stream-ordered collective's device buffers.
//
// A collective bound to a stream (CollOptions::stream, Group::end(opt)) holds the stream's
// later work behind a flag wait (core/stream_order.h). Device work it queued after the call
// returned, on any stream, can sit behind that wait and never run: streams share a few
// hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default and 1 in many training
// setups), work in one queue runs in the order it was queued, and the stream's later work
// is queued before the collective's own. Measured on an H100 with
// CUDA_DEVICE_MAX_CONNECTIONS=1: a stream-ordered all_reduce hung.
//
// So such a collective queues all its device work at the call, on the stream itself: its
// device buffers are copied into registered host memory ahead of the event it waits for,
// its schedule runs on those host copies (host transfers and reductions), and the results
// are copied back behind the flag wait. HMC_STREAM_STAGE=0 keeps the device buffers in the
// schedule: faster between GPUs of one host, and liable to hang wherever streams share a
// queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/schedule.h"
#include "collectives/scratch.h"
#include "core/stream_order.h"
#include "hmc/status.h"

namespace hmc::core {
class ContextImpl;
}

namespace hmc::coll {

// A user buffer of one call: [p, p + bytes).
struct Extent {
  const void* p = nullptr;
  std::size_t bytes = 0;
};

class StreamStage {
 public:
  StreamStage() = default;
  // Host copies of those of `in` (read by the collective) and `out` (written by it; an
  // output the collective may leave partly unwritten must be listed in `in` too) that are
  // device memory of `where`'s provider. Empty when there are none, or when that provider
  // cannot register host memory (logged: the collective then runs on the device buffers).
  // Waits while `pool`'s staging would grow past `limit` bytes (HMC_STREAM_STAGE_MAX) for
  // earlier calls to give theirs back; kTimeout after HMC_TIMEOUT.
  static Result<StreamStage> make(core::ContextImpl& ctx, const std::shared_ptr<ScratchPool>& pool,
                                  std::size_t limit, const void* where, const std::vector<Extent>& in,
                                  const std::vector<Extent>& out);
  bool empty() const { return spans_.empty(); }
  // Moves the schedule's pointers into staged buffers onto their host copies, and has the
  // collective's scratch hold the host memory while it runs (and leak it if it fails).
  void apply(Schedule& s, Scratch& scratch) const;
  // What StreamOrder::create queues around the wait; holds the host memory.
  core::StreamCopies copies() const { return {in_, out_, keep_}; }

 private:
  struct Span {
    const uint8_t* user;
    std::size_t bytes;
    uint8_t* host;
  };
  uint8_t* host_of(const void* p) const;
  std::vector<Span> spans_;
  std::vector<core::StreamCopy> in_, out_;
  std::shared_ptr<void> keep_;
};

}  // namespace hmc::coll
