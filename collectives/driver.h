// Driver: the Progressable that runs every collective in flight on one ProgressEngine.
//
// One driver per engine rather than one Progressable per collective: ProgressEngine's
// pass copies its list and runs it unlocked, so remove() does not wait for another
// thread's pass that already holds the pointer; a per-collective object freed after
// remove() could still be called. The driver lives as long as its engine (it is freed
// only once the engine is gone), is registered while it has collectives to run and
// removed when idle, so an idle communicator costs the progress loop nothing.
//
// Lock order: Driver::mu_, then CommImpl::mu_ (posting sends/receives), then the
// engine's. progress() takes mu_ with try_lock: one thread advances the collectives
// while others keep driving point-to-point.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "collectives/coll_op.h"
#include "collectives/driver_op.h"
#include "core/progress.h"
#include "core/stream_order.h"

namespace hmc::coll {

class Driver final : public core::Progressable {
 public:
  static Driver& of(const std::shared_ptr<core::ProgressEngine>& engine);

  // Posts op's first sends and receives now, on the caller's thread, then runs it in
  // progress(). With `order`, op starts only once order->ready(), and order->finish()
  // runs when op ends.
  void launch(std::unique_ptr<DriverOp> op, std::shared_ptr<core::StreamOrder> order = nullptr);
  bool progress() override;
  // Communicator `comm` is aborted or destroyed: every collective that still uses it fails
  // with `why` and leaves the driver, so that no later pass touches its buffers or reaches
  // the freed communicator. Waits for a pass in flight.
  static void drop(const std::shared_ptr<core::ProgressEngine>& engine, const void* comm, const Status& why);

 private:
  explicit Driver(core::ProgressEngine* engine) : engine_(engine) {}
  core::ProgressEngine* engine_;
  std::mutex mu_;
  struct Entry {
    std::unique_ptr<DriverOp> op;
    std::shared_ptr<core::StreamOrder> order;
    bool started;
  };
  std::vector<Entry> ops_;  // oldest first
  std::vector<const void*> held_lines_;  // progress(): lines whose first op waits
  bool registered_ = false;
};

}  // namespace hmc::coll
