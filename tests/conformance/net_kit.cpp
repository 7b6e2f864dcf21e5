// Catch half of the net kit harness: connected pairs, the per-plugin loop,
// child processes and the program's main.
#define CATCH_CONFIG_RUNNER
#include "net_kit.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <thread>

namespace hmc_conformance {

Link listen_local(Session& s) {
  Link link;
  char addr[HMC_NET_ADDR_MAX];
  size_t addr_len = 0;
  REQUIRE(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &link.listener) ==
          HMC_PROV_OK);
  link.addr.assign(addr, addr_len);
  return link;
}

Link connect_pair(Session& a, Session& b) {
  Link link = listen_local(b);
  const std::vector<char> hello = random_bytes(64, 1);
  REQUIRE(a.p->connect(a.state, link.addr.data(), link.addr.size(), hello.data(), hello.size(), &link.a) ==
          HMC_PROV_OK);
  std::vector<char> got;
  link.b = b.accept(link.listener, &got);
  REQUIRE(link.b != nullptr);
  REQUIRE(got == hello);
  REQUIRE(a.wait_connected(link.a) == HMC_PROV_OK);
  return link;
}

void for_each_plugin(const std::function<void(Session&)>& body) {
  const auto paths = plugin_paths();
  if (paths.empty()) {
    FAIL("no plugin found: set HMC_CONFORMANCE_NET_PLUGIN or build one into "
         << HMC_CONFORMANCE_PLUGIN_DIR);
  }
  for (const auto& path : paths) {
    DYNAMIC_SECTION(path) {
      Session s;
      bool ok = s.open(path);
      if (s.init_rc == HMC_PROV_ERR_UNAVAILABLE) {
        WARN(path << " is unavailable here (" << s.reason << "): skipped");
        CHECK_FALSE(s.reason.empty());
      } else {
        INFO("opening " << path << ": " << s.reason);
        REQUIRE(ok);
        INFO("plugin " << s.p->name << ", seed " << seed());
        body(s);
      }
    }
  }
}

Child::Child(const std::vector<std::string>& args) {
  // Everything exec needs is built before fork: the child only calls
  // async-signal-safe functions until execv.
  std::vector<std::string> all = {"/proc/self/exe", kChildFlag};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  const pid_t parent = getpid();
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(99);
    execv(exe, argv.data());
    _exit(98);
  }
}

Child::~Child() {
  kill();
  wait_exit(std::chrono::milliseconds(10000));
  if (!reaped_) waitpid(pid_, nullptr, 0);  // SIGKILLed: returns promptly
}

void Child::kill() {
  if (pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
}

int Child::wait_exit(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!reaped_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (r < 0 || Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

}  // namespace hmc_conformance

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], hmc_conformance::kChildFlag) == 0) {
    return hmc_conformance::child_main(argc, argv);
  }
  std::fprintf(stderr, "hmc-conformance-net: seed %llu (HMC_CONFORMANCE_SEED to repeat)\n",
               static_cast<unsigned long long>(hmc_conformance::seed()));
  return Catch::Session().run(argc, argv);
}
