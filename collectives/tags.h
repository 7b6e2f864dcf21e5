// Tags of collective traffic, in the space CommImpl reserves for collectives (top bit set).
//
//   bit 63       reserved-for-collectives flag (the public Communicator refuses it)
//   bits 40..62  sequence number of the collective on its communicator (wraps)
//   bits 20..39  step of the algorithm
//   bits  0..19  chunk within the step
//
// Every rank calls collectives in the same order, so the n-th collective has the same
// sequence number everywhere and several collectives in flight never take each other's
// messages. The two highest sequence values are not used by collectives: they hold
// channels that are not collectives over the whole communicator (grouped send/recv, the
// delegation's exchanges).
#pragma once

#include <cstdint>

#include "hmc/status.h"

namespace hmc::core {
class CommImpl;
}

namespace hmc::coll {

inline constexpr uint64_t kReservedBit = 1ull << 63;
inline constexpr int kSeqShift = 40;
inline constexpr uint64_t kSeqMask = (1ull << 23) - 1;
inline constexpr uint64_t kChannelSeq = kSeqMask;  // never a collective's sequence number
// Nor this: the delegation's exchanges (ccl.cpp), which start and end at times that differ
// between ranks, so they cannot take a number in call order. One runs after another on
// each rank, and a peer's messages of one tag match in order.
inline constexpr uint64_t kAgreeSeq = kSeqMask - 1;
inline constexpr uint64_t kMaxStep = (1ull << 20) - 1;
inline constexpr uint64_t kMaxChunks = 1ull << 20;
// The argument check's messages use the last step.
inline constexpr uint64_t kCheckStep = kMaxStep;

inline uint64_t tag_base(uint64_t seq) { return kReservedBit | (seq << kSeqShift); }
inline uint64_t subtag(uint64_t step, uint64_t chunk = 0) { return (step << 20) | chunk; }

// Grouped send/recv: one channel; the n-th send from A to B matches B's n-th receive from
// A (CommImpl matches a peer's messages of one tag in order), as NCCL's grouped calls do.
inline constexpr uint64_t kGroupTag = kReservedBit | (kChannelSeq << kSeqShift) | 1;

// Takes the next sequence number of `comm`. The counter lives in the communicator's
// collective state (comm_state.h), so it starts at 0 for every new communicator.
uint64_t next_sequence(core::CommImpl& comm);

}  // namespace hmc::coll
