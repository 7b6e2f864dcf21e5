// Whether a send of a given size went eagerly or by rendezvous, seen from outside: rank 0
// sends before rank 1 has posted the receive. An eager send completes on its own (within
// 5 s); a rendezvous send waits for the receiver (still pending after 300 ms). Then rank 1
// receives into `into` and checks the bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "multiprocess.h"

namespace hmc::test {

// For a body of run_ranks with 2 ranks: 0 when the send behaved as `eager` says and the data
// arrived intact, else 1 after printing what did not (HMC_EXPECT). `into` (rank 1 only) holds
// `bytes`; null: a vector of the test's own.
int check_send_before_receive(RankEnv& e, std::size_t bytes, bool eager, uint8_t* into = nullptr);

}  // namespace hmc::test
