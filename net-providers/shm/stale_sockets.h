// Socket files that processes killed before their close left in HMC_SHM_DIR.
#pragma once

#include <string>

namespace hmc_shm {

// The tag of this boot of this host's kernel in socket file names: 8 hex digits of
// /proc/sys/kernel/random/boot_id ("0" where it cannot be read).
const std::string& boot_tag();

// The name of a listener's socket file: hmc-shm-b<boot tag>-<pid>-<n>-<random>.sock.
std::string socket_name(unsigned long n, const std::string& random);

// Unlinks this user's socket files of this boot (socket_name) in `dir` whose process is
// gone and that nothing listens on any more; returns how many. Both checks: a pid seen
// from another pid namespace may look gone while its listener lives, and a live pid may own
// a stale file only if it was reused. Files of another boot tag are left alone: where the
// folder is shared between hosts (HMC_SHM_DIR on NFS) a connect to another kernel's
// socket is refused and its pids are not ours. A listener's file gets its name only once
// it listens (bound under another name, ".new", then renamed), so no sweep takes it for
// dead between bind and listen; a ".new" file over a minute old is swept (its process was
// killed in between). Once per directory and process (later calls return 0).
int sweep_stale_sockets(const std::string& dir);

}  // namespace hmc_shm
