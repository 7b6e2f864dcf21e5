// ShmColl: small collectives over the communicator's shared host segments
// (core/host_segments.h), when every rank runs on this host and has no device but the CPU.
//
// Each rank copies its input (up to kSlotBytes) into one of the two slots of its own
// segment and publishes the collective's sequence number there; once every rank's
// number is up it computes its result from all slots itself (reductions in rank order,
// so every rank gets the same bits) and publishes that it is done reading. A slot is
// written again two collectives later, once every rank is done with it. Nothing here
// blocks: what cannot happen yet waits for the next progress pass (collectives/driver.h).
// all_reduce, all_gather and all_to_all go this way; a peer lost or the communicator
// aborted fails a pending one with that reason.
#pragma once

#include <memory>
#include <optional>

#include "collectives/ccl.h"
#include "collectives/comm_state.h"
#include "hmc/collectives.h"

namespace hmc::coll {

inline constexpr std::size_t kSlotBytes = 4096;

// The request of `w` run over the shared segments, or nullopt when this call does not
// qualify (the same answer on every rank: it depends only on the communicator and on
// arguments all ranks pass alike).
std::optional<Request> try_shm(core::CommImpl& comm, CommState& state, const CclWork& w, const CollOptions& opt);

}  // namespace hmc::coll
