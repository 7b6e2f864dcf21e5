// shm's listening sockets left behind by killed processes: the first shm provider of a
// process unlinks those nobody owns, and only those (net-providers/shm/stale_sockets.h).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "hmc/context.h"
#include "shm/stale_sockets.h"

using hmc_shm::boot_tag;

using namespace hmc;
namespace fs = std::filesystem;

namespace {

// A socket bound at `path`; listening or not. Returns its fd (closed by the caller).
int bind_at(const std::string& path, bool listening) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(fd >= 0);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  if (listening) REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

// The pid of a process that has exited and been reaped.
pid_t gone_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  REQUIRE(pid > 0);
  REQUIRE(::waitpid(pid, nullptr, 0) == pid);
  return pid;
}

struct TempDir {
  std::string path;
  TempDir() {
    char templ[] = "/tmp/hmc-sweep-XXXXXX";
    REQUIRE(::mkdtemp(templ) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("shm unlinks the socket files of processes gone, and nothing else", "[shm][config]") {
  TempDir dir;
  const pid_t gone = gone_pid();
  const std::string prefix = dir.path + "/hmc-shm-b" + boot_tag() + "-";
  const std::string stale = prefix + std::to_string(gone) + "-1-00000000deadbeef.sock";
  const std::string listened = prefix + std::to_string(gone) + "-2-00000000deadbeef.sock";  // a pid from another namespace
  const std::string mine = prefix + std::to_string(::getpid()) + "-99-00000000deadbeef.sock";
  const std::string plain = prefix + std::to_string(gone) + "-3-00000000deadbeef.sock";
  const std::string other = dir.path + "/other.sock";
  // Another host's, in a folder two hosts share: its pid is not ours to look up, and a
  // connect to a socket of another kernel is refused, so it looked stale from here.
  const std::string elsewhere = dir.path + "/hmc-shm-b" + (boot_tag() == "0f0f0f0f" ? "1e1e1e1e" : "0f0f0f0f") +
                                "-" + std::to_string(gone) + "-4-00000000deadbeef.sock";
  ::close(bind_at(stale, false));
  const int listener = bind_at(listened, true);
  ::close(bind_at(mine, false));
  ::close(bind_at(other, false));
  ::close(bind_at(elsewhere, false));
  // A listener's name between bind and rename: kept while young (it may be live, in another
  // pid namespace), swept when over a minute old (its process died in between).
  const std::string young = prefix + std::to_string(gone) + "-6-00000000deadbeef.new";
  const std::string old = prefix + std::to_string(gone) + "-7-00000000deadbeef.new";
  ::close(bind_at(young, false));
  ::close(bind_at(old, false));
  const timespec two_minutes_ago[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  REQUIRE(::utimensat(AT_FDCWD, old.c_str(), two_minutes_ago, AT_SYMLINK_NOFOLLOW) == 0);
  std::ofstream(plain) << "not a socket";

  auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,shm"}, {"HMC_SHM_DIR", dir.path}}});
  ::close(listener);
  REQUIRE(ctx.ok());
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(listened));
  CHECK(fs::exists(mine));
  CHECK(fs::exists(plain));
  CHECK(fs::exists(other));
  CHECK(fs::exists(elsewhere));
  CHECK(fs::exists(young));
  CHECK_FALSE(fs::exists(old));
  // The provider's own listener carries this boot's tag and listens under its final name.
  int own = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    const std::string name = entry.path().filename();
    if (name.find("-" + std::to_string(::getpid()) + "-") != std::string::npos) CHECK(name.find(".new") == std::string::npos);
    if (name.rfind("hmc-shm-b" + boot_tag() + "-" + std::to_string(::getpid()) + "-", 0) == 0) ++own;
  }
  CHECK(own >= 1);
}
