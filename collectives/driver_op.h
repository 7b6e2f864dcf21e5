// DriverOp: what collectives/driver.h runs in the progress loop.
#pragma once

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
};

}  // namespace hmc::coll
