// StreamOrder: ties one operation to a device stream the application gave (the NCCL
// contract). The operation starts once the work queued on the stream before the call has
// finished (an event recorded at the call), and work queued on the stream after the call
// waits for the operation (the stream waits on a host flag that finish() sets). No host
// thread blocks: the context's progress engine runs a background thread while any
// stream-ordered operation is pending, since nobody may ever wait on its Request.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "core/plugin_registry.h"
#include "core/progress.h"
#include "hmc/status.h"

namespace hmc::core {

class ContextImpl;

// Copies queued on the stream around the operation, all at the call: `in` ahead of the
// event the operation waits for, `out` behind the flag wait. A stream-ordered collective
// moves its device buffers through host memory this way (collectives/stream_stage.h), so
// that it queues no device work once the call returned: work queued later, on any stream,
// could sit behind the flag wait in a hardware queue the streams share and never run.
// `keep` holds the host memory until the stream has passed the `out` copies.
struct StreamCopy {
  void* dst;
  const void* src;
  std::size_t bytes;
};
struct StreamCopies {
  std::vector<StreamCopy> in, out;
  std::shared_ptr<void> keep;
};

// Lets go of `owner` without ever releasing what it holds: memory a device stream or a
// late message may still write.
inline void leak_forever(std::shared_ptr<void> owner) {
  if (owner) new std::shared_ptr<void>(std::move(owner));
}

class StreamOrder {
 public:
  // Queues `copies.in`, records the event, queues the wait and `copies.out` on `stream`
  // of `provider`'s `device`.
  static Result<std::shared_ptr<StreamOrder>> create(ContextImpl& ctx, LoadedProvider* provider, int device,
                                                     void* stream, StreamCopies copies = {});
  ~StreamOrder();
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // The work queued before the call has finished (or the event failed: start anyway,
  // the operation's own error handling applies).
  bool ready();
  // Lets the stream's later work run; call once the operation ended, whichever way.
  void finish();

 private:
  StreamOrder(ContextImpl& ctx, LoadedProvider* p) : ctx_(ctx), p_(p) {}
  ContextImpl& ctx_;
  LoadedProvider* p_;
  int device_ = 0;
  void* before_ = nullptr;  // recorded at the call: the work the operation waits for
  void* after_ = nullptr;   // recorded behind the flag wait: done once the stream passed it
  volatile uint32_t* flag_ = nullptr;
  std::shared_ptr<void> keep_;  // what the stream's copies read, until it passed them
  bool finished_ = false;
};

// Flags and events of finished operations. Once their stream has passed the wait the
// events are destroyed and the flag is kept for the next operation on that device: freeing
// it would be a pinned-memory free (cudaFreeHost), which waits for the whole device and so
// for any other stream still held by an HMC flag. Flags are freed with the context.
class StreamRetirement {
 public:
  ~StreamRetirement();
  void add(LoadedProvider* p, int device, volatile uint32_t* flag, void* after, void* before,
           std::shared_ptr<void> keep = nullptr);
  void sweep();
  // A spare flag of `p`'s `device`, or a new one.
  int take_flag(LoadedProvider* p, int device, volatile uint32_t** flag);

 private:
  struct Entry {
    LoadedProvider* p;
    int device;
    volatile uint32_t* flag;
    void* after;
    void* before;
    std::shared_ptr<void> keep;  // released once the stream passed `after`
  };
  struct Spare {
    LoadedProvider* p;
    int device;
    volatile uint32_t* flag;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<Spare> spare_;
};

}  // namespace hmc::core
