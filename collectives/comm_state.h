// What the collectives layer keeps per communicator, in CommImpl's upper-state slot: the
// settings, the sequence counter that names each collective's tags, the pool of device
// scratch, and the delegation to a vendor collective library.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "collectives/scratch.h"
#include "collectives/settings.h"

namespace hmc::core {
class CommImpl;
class ProgressEngine;
}

namespace hmc::coll {

class CclLink;  // ccl.cpp

// Sequence numbers of the collectives over shared segments (shm_coll.cpp): the next one
// to hand out and the last one this rank finished. Each pending one holds it too, since it
// may outlive the communicator.
struct ShmSeq {
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> finished{0};
  // The first sequence number of the earliest collective over the segments that failed
  // here: the later ones, which wait for its rounds to finish (`finished`), never run;
  // after a loss they fail rather than wait. Written under the driver's lock.
  std::atomic<uint64_t> failed_from{UINT64_MAX};
};

struct CommState {
  CommState(std::shared_ptr<core::ProgressEngine> engine, const core::CommImpl* comm)
      : engine_(std::move(engine)), comm_(comm) {}
  // Destroyed with the communicator: collectives still running on it fail (Driver::drop).
  ~CommState();
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  CollSettings settings;  // read when the state is made
  std::mutex mu;
  uint64_t next_seq = 0;
  std::shared_ptr<ScratchPool> scratch = std::make_shared<ScratchPool>();
  std::shared_ptr<CclLink> ccl;  // delegation to a vendor library (ccl.h), made on first use
  std::atomic<CclLink*> ccl_link{nullptr};  // ccl.get() once made: read without the lock
  std::shared_ptr<ShmSeq> shm = std::make_shared<ShmSeq>();
  std::once_flag abort_hook;  // comm_state() registers it once

 private:
  std::shared_ptr<core::ProgressEngine> engine_;
  const core::CommImpl* comm_;
};

// Made on first use; lives as long as the communicator.
CommState& comm_state(core::CommImpl& comm);

}  // namespace hmc::coll
