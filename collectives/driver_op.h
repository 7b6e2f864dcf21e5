// DriverOp: what collectives/driver.h runs in the progress loop.
#pragma once

#include <utility>

#include "hmc/status.h"

namespace hmc::coll {

// What the driver runs: a collective laid out as a schedule (CollOp) or a small one over
// shared segments (ShmColl, shm_coll.h).
class DriverOp {
 public:
  virtual ~DriverOp() = default;
  virtual void start() = 0;
  virtual bool advance() = 0;
  virtual bool finished() const = 0;
  // The context is going away: fail without touching the communicator again.
  virtual void abandon(Status why) = 0;
  // Whether it still uses communicator `comm` (a CollOp posts on it until it ends).
  virtual bool uses(const void* comm) const { (void)comm; return false; }
  // That communicator is being destroyed: fail without touching it again.
  virtual void drop(Status why) { abandon(std::move(why)); }
  // Ops that run strictly in line (the collectives over one communicator's shared
  // segments) name their line; one that has not begun says so with waiting_in_line(), and
  // then none after it in that line can begin either: the driver skips them (70,000 small
  // collectives in flight took a pass over all of them per step).
  virtual const void* line() const { return nullptr; }
  virtual bool waiting_in_line() const { return false; }
};

}  // namespace hmc::coll
