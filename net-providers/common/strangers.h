// How long, and how many, connections a listener keeps before the host took them (tcp's
// and shm's listeners, ucx's lifelines): a stranger holding connections open must use up
// neither this process's descriptors nor the job's way in.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>

namespace hmc_net {

// A connection that has not said its hello by then is closed: a peer says it as soon as it
// connects.
inline constexpr auto kHelloWait = std::chrono::seconds(10);
// One whose hello the host has not taken (accept) by then is closed: twice the host's
// default HMC_TIMEOUT, so a late host still finds its peers.
inline constexpr auto kUntakenWait = std::chrono::seconds(120);

// How many may wait at once, for their hello or for the host: a quarter of the descriptors
// this process may open, and at least 256 (a job large enough for a burst of peers to come
// near it needs a descriptor per peer anyway). Past it the oldest is closed for each new
// one: a genuine peer says its hello at once, before a crowd can push it out.
inline std::size_t max_waiting_connections() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1 << 16;
  return std::max<std::size_t>(256, r.rlim_cur / 4);
}

}  // namespace hmc_net
