// What the collectives layer keeps per communicator, in CommImpl's upper-state slot: the
// settings, the sequence counter that names each collective's tags, the pool of device
// scratch, and the delegation to a vendor collective library.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "collectives/scratch.h"
#include "collectives/settings.h"

namespace hmc::core {
class CommImpl;
}

namespace hmc::coll {

class CclLink;  // ccl.cpp

struct CommState {
  CollSettings settings;  // read when the state is made
  std::mutex mu;
  uint64_t next_seq = 0;
  std::shared_ptr<ScratchPool> scratch = std::make_shared<ScratchPool>();
  std::shared_ptr<CclLink> ccl;  // delegation to a vendor library (ccl.h), made on first use
  std::shared_ptr<void> shm;     // small collectives over shared segments (shm_coll.cpp), made on first use
};

// Made on first use; lives as long as the communicator.
CommState& comm_state(core::CommImpl& comm);

}  // namespace hmc::coll
