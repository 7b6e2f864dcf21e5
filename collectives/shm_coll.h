// ShmColl: all_reduce, reduce, all_gather, all_to_all, reduce_scatter, broadcast and
// barrier over the communicator's shared host segments (core/host_segments.h), when every
// rank runs on this host and has no device but the CPU.
//
// A collective runs in rounds of up to kSlotBytes of each rank's input. In a round each
// rank copies its part into one of the two slots of its own segment and publishes the
// round's sequence number there; once every rank's number is up it copies its result out
// of all slots, and publishes that it is done reading. A slot is written again two rounds
// later, once every rank is done with it, so the next round's input goes in while this
// one is read. Reductions run in rank order, so every rank gets the same bits. all_reduce
// reduces small rounds whole on every rank, larger ones a share per rank, published in the
// rank's own slot for the others to gather; reduce does the same for its root alone;
// reduce_scatter reduces each rank's block on that rank. In a broadcast only the root's
// slot carries data; a barrier is one round with none. Nothing here blocks: what cannot
// happen yet waits for the next progress pass (collectives/driver.h). The communicator
// finalized or aborted fails a pending collective at once; a peer lost fails it once it
// waits for what that peer never published, so rounds whose inputs the peer had
// published still complete.
#pragma once

#include <memory>
#include <optional>

#include "collectives/ccl.h"
#include "collectives/comm_state.h"
#include "core/host_segments.h"
#include "hmc/collectives.h"

namespace hmc::coll {

inline constexpr std::size_t kSlotBytes = core::HostSegments::kSlotBytes;

// The request of `w` run over the shared segments, or nullopt when this call does not
// qualify (the same answer on every rank: it depends only on the communicator and on
// arguments all ranks pass alike). `call`: the call's sequence number (Call::seq).
std::optional<Request> try_shm(core::CommImpl& comm, CommState& state, const CclWork& w, const CollOptions& opt,
                               uint64_t call);

}  // namespace hmc::coll
