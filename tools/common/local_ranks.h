// --local N for HMC's tools: this process hosts the bootstrap root and runs N copies of
// itself (with `args`) as ranks, HMC_ROOT=<unique id>, HMC_RANK, HMC_WORLD_SIZE, then reaps
// them; "{rank}" in an HMC_* variable's value becomes each rank's number. A failed rank
// leaves the others 10 s; nothing outlives timeout_s.
#pragma once

#include <string>
#include <vector>

namespace hmc::tools {

// Returns the first failing rank's exit code, 124 on timeout, 0 when all succeeded.
int run_local_ranks(const char* tool, int n, const std::vector<std::string>& args, int timeout_s);

// The name the kernel keeps for this process (ps -o comm, pgrep -x, the OOM killer's log):
// argv[0]'s last part. Ranks, started from /proc/self/exe, would otherwise be "exe".
void name_this_process(const char* argv0);

}  // namespace hmc::tools
