// The per-communicator state of collectives, and its sequence counter.
#include "collectives/ccl.h"
#include "collectives/comm_state.h"
#include "collectives/driver.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"

namespace hmc::coll {

CommState::~CommState() {
  Driver::drop(engine_, comm_, {ErrorCode::kFinalized, "the communicator was destroyed while the collective was pending"});
}

CommState& comm_state(core::CommImpl& comm) {
  auto state = comm.upper_state([&comm] {
    auto st = std::make_shared<CommState>(comm.context().engine(), &comm);
    st->settings = CollSettings::read(comm.context().config());
    return st;
  });
  auto& st = *static_cast<CommState*>(state.get());  // the communicator keeps it alive
  // Once abort() returns nothing touches the collectives' buffers. The vendor link ends
  // first, so that none of its waiting calls is launched into the driver after the drop;
  // then the ones in the driver fail there, under its lock, so a pass copying for them has
  // ended. The state outlives the hook: abort() runs before the communicator's members go.
  // (Not from upper_state's `make`: on_abort takes the lock that upper_state holds.)
  std::call_once(st.abort_hook, [&comm, &st] {
    comm.on_abort([engine = comm.context().engine(), c = &comm, state = &st] {
      abort_delegation(*state);
      Driver::drop(engine, c, {ErrorCode::kAborted, "the communicator was aborted while the collective was pending"});
    });
  });
  return st;
}

uint64_t next_sequence(core::CommImpl& comm) {
  // Collectives on one communicator are issued in one order on every rank, so callers
  // do not race in a correct program; the lock keeps the counter intact when they do.
  CommState& st = comm_state(comm);
  std::lock_guard lock(st.mu);
  const uint64_t seq = st.next_seq;
  st.next_seq = (seq + 1) % kAgreeSeq;
  return seq;
}

}  // namespace hmc::coll
