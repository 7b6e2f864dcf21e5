// Socket files that processes killed before their close left in HMC_SHM_DIR.
#pragma once

#include <string>

namespace hmc_shm {

// Unlinks this user's hmc-shm-<pid>-*.sock files in `dir` whose process is gone and that
// nothing listens on any more; returns how many. Both checks: a pid seen from another pid
// namespace may look gone while its listener lives, and a live pid may own a stale file
// only if it was reused. Once per directory and process (later calls return 0).
int sweep_stale_sockets(const std::string& dir);

}  // namespace hmc_shm
