// The per-communicator sequence counter of collectives.
//
// CommImpl has no field for collectives, and a side table keyed by its address would hand
// a stale counter to a new communicator allocated at a freed one's address (on some ranks
// and not others, so tags would stop matching). Instead the counter is stored in the
// communicator: as one message this rank sent to itself on a reserved tag. A send to self
// is delivered inside isend (to a posted receive, else into the unexpected queue) and a
// receive finds a queued message inside irecv, so reading and writing the counter never
// waits. A new communicator has no such message: the receive stays posted, and the first
// write completes it. The message dies with the communicator.
#include <cstring>
#include <mutex>

#include "collectives/tags.h"
#include "core/comm_impl.h"

namespace hmc::coll {
namespace {

constexpr uint64_t kSlotTag = kReservedBit | (kChannelSeq << kSeqShift) | 0;

}  // namespace

Result<uint64_t> next_sequence(core::CommImpl& comm) {
  // Collectives on one communicator are issued in one order on every rank, so callers
  // do not race in a correct program; the lock keeps the slot intact when they do.
  static std::mutex mu;
  std::lock_guard lock(mu);
  uint64_t seq = 0;
  auto got = comm.irecv(&seq, sizeof(seq), comm.rank(), kSlotTag);
  bool fresh = !got->done();
  uint64_t next = (seq + 1) % kChannelSeq;
  if (fresh) {
    // First use: complete the posted receive (into `seq`, still 0) so nothing is left
    // pointing at this stack frame, then store the counter.
    uint64_t zero = 0;
    auto fill = comm.isend(&zero, sizeof(zero), comm.rank(), kSlotTag);
    if (!got->done() || !fill->status().ok()) return Status(ErrorCode::kInternal, "collective sequence slot did not complete a send to self");
    seq = 0;
    next = 1;
  } else if (!got->status().ok()) {
    return got->status();
  }
  auto store = comm.isend(&next, sizeof(next), comm.rank(), kSlotTag);
  if (!store->status().ok()) return store->status();
  return seq;
}

}  // namespace hmc::coll
