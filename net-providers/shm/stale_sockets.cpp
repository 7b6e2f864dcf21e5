// A process killed before fini (SIGKILL, an unhandled SIGINT) cannot unlink its listening
// socket; without a sweep such files pile up in /tmp. The first shm provider of a process
// clears those of its user that belong to nobody.
#include "stale_sockets.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>

namespace hmc_shm {
namespace {

std::string prefix() { return "hmc-shm-b" + boot_tag() + "-"; }

constexpr time_t kFreshSeconds = 60;

// The pid in a socket_name of this boot, or 0 for any other name; `fresh`: the name a
// listener has between bind and listen (".new" for ".sock").
pid_t owner_of(const char* name, bool& fresh) {
  const std::string ours = prefix();
  const size_t len = std::strlen(name);
  if (std::strncmp(name, ours.c_str(), ours.size()) != 0) return 0;
  fresh = len >= 4 && std::strcmp(name + len - 4, ".new") == 0;
  if (!fresh && (len < 5 || std::strcmp(name + len - 5, ".sock") != 0)) return 0;
  const char* digits = name + ours.size();
  if (!std::isdigit(static_cast<unsigned char>(*digits))) return 0;
  char* end = nullptr;
  const long pid = std::strtol(digits, &end, 10);
  return pid > 0 && end && *end == '-' ? static_cast<pid_t>(pid) : 0;
}

// Whether a connect to `path` is refused: no process listens there (a listener that is
// merely busy accepts or queues the connection).
bool nobody_listens(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const bool refused = rc != 0 && errno == ECONNREFUSED;
  ::close(fd);
  return refused;
}

}  // namespace

const std::string& boot_tag() {
  static const std::string tag = [] {
    std::string id, hex;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
    for (char c : id)
      if (std::isxdigit(static_cast<unsigned char>(c)) && hex.size() < 8) hex += static_cast<char>(std::tolower(c));
    return hex.size() == 8 ? hex : std::string("0");
  }();
  return tag;
}

std::string socket_name(unsigned long n, const std::string& random) {
  return prefix() + std::to_string(::getpid()) + "-" + std::to_string(n) + "-" + random + ".sock";
}

int sweep_stale_sockets(const std::string& dir) {
  static std::mutex mu;
  static std::set<std::string> swept;
  {
    std::lock_guard lock(mu);
    if (!swept.insert(dir).second) return 0;
  }
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    bool fresh = false;
    const pid_t pid = owner_of(e->d_name, fresh);
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid()) continue;
    // A listener keeps its ".new" name for the microseconds between bind and rename: one
    // a minute old belongs to a process killed in between, whatever its pid namespace.
    const bool stale = fresh ? ::time(nullptr) - st.st_mtime > kFreshSeconds : nobody_listens(path);
    if (stale && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace hmc_shm
