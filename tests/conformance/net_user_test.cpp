// A peer of another user. shm's peers write each other's memory (single-copy puts), so it
// connects processes of one user only: its socket file is 0600, and a connection whose
// other end runs as another uid is refused whichever side opened it. Needs root (to run a
// process as `nobody`); skipped otherwise, and for every other plugin.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "net_kit.h"

using namespace hmc_conformance;

namespace {

constexpr uid_t kNobody = 65534;

// A forked process, killed (if still running) and reaped on destruction.
struct Forked {
  pid_t pid = -1;
  ~Forked() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // Exit code, or -1 when it did not exit within `limit`.
  int exit_code(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }
};

sockaddr_un unix_addr(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  return a;
}

// Child side: true once `fd` reads end of file or a reset within `ms`.
bool closed_by_peer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  char c;
  const ssize_t n = ::read(fd, &c, 1);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

bool become_nobody() { return ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0; }

}  // namespace

TEST_CASE("net: shm refuses a peer of another user, whichever side connects", "[net][shm][uid]") {
  if (::geteuid() != 0) {
    WARN("not root: no process of another user to try; skipped");
    return;
  }
  for_each_plugin([](Session& s) {
    if (std::string(s.p->name) != "shm") return;
    const Link link = listen_local(s);
    const std::string path = link.addr.c_str();
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);

    SECTION("a stranger of another user connects") {
      // Opened to all anyway (by hand, or a directory that grants more): still refused.
      REQUIRE(::chmod(path.c_str(), 0666) == 0);
      Forked child;
      child.pid = ::fork();
      REQUIRE(child.pid >= 0);
      if (child.pid == 0) {
        if (!become_nobody()) ::_exit(2);
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        const sockaddr_un a = unix_addr(path);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) ::_exit(3);
        ::_exit(closed_by_peer(fd, 5000) ? 0 : 4);  // 4: the provider kept it
      }
      CHECK(child.exit_code(std::chrono::seconds(10)) == 0);
      void* conn = nullptr;
      size_t hello_len = 0;
      CHECK(s.p->accept(s.state, link.listener, &conn, nullptr, 0, &hello_len) == HMC_PROV_IN_PROGRESS);
    }

    SECTION("this side connects to a socket of another user") {
      char dir_templ[] = "/tmp/hmc-uid-XXXXXX";
      REQUIRE(::mkdtemp(dir_templ) != nullptr);
      const std::string dir = dir_templ;
      REQUIRE(::chmod(dir.c_str(), 0777) == 0);
      const std::string theirs = dir + "/theirs.sock";
      int ready[2];
      REQUIRE(::pipe(ready) == 0);
      Forked child;
      child.pid = ::fork();
      REQUIRE(child.pid >= 0);
      if (child.pid == 0) {
        ::close(ready[0]);
        if (!become_nobody()) ::_exit(2);
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        const sockaddr_un a = unix_addr(theirs);
        if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) ::_exit(3);
        const char go = 1;
        if (::write(ready[1], &go, 1) != 1) ::_exit(3);
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 10000) != 1) ::_exit(4);
        const int conn = ::accept(fd, nullptr, nullptr);
        ::_exit(conn >= 0 && closed_by_peer(conn, 5000) ? 0 : 5);  // 5: the provider stayed
      }
      ::close(ready[1]);
      char go = 0;
      pollfd p{ready[0], POLLIN, 0};
      REQUIRE(::poll(&p, 1, 10000) == 1);
      REQUIRE(::read(ready[0], &go, 1) == 1);
      ::close(ready[0]);
      void* conn = nullptr;
      const char hello[] = "hello";
      REQUIRE(s.p->connect(s.state, theirs.data(), theirs.size(), hello, sizeof(hello), &conn) == HMC_PROV_OK);
      CHECK(s.wait_connected(conn) == HMC_PROV_ERR_REFUSED);
      CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
      CHECK(child.exit_code(std::chrono::seconds(10)) == 0);
      ::unlink(theirs.c_str());
      ::rmdir(dir.c_str());
    }
    CHECK(s.p->close_listener(s.state, link.listener) == HMC_PROV_OK);
  });
}
