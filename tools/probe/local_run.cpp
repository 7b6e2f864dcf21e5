// Spawning N ranks of this program on this machine; the parent hosts the bootstrap root.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "probe.h"

extern char** environ;

namespace hmc::probe {

int run_local(int n, const std::vector<std::string>& worker_args, int timeout_s) {
  auto ctx = Context::create();
  if (!ctx) return std::fprintf(stderr, "hmc-probe: %s\n", ctx.status().to_string().c_str()), 1;
  auto id = ctx->create_unique_id();
  if (!id) return std::fprintf(stderr, "hmc-probe: %s\n", id.status().to_string().c_str()), 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (kv.rfind("HMC_RANK=", 0) && kv.rfind("HMC_WORLD_SIZE=", 0) && kv.rfind("HMC_ROOT=", 0)) env_store.push_back(kv);
    }
    env_store.push_back("HMC_RANK=" + std::to_string(r));
    env_store.push_back("HMC_WORLD_SIZE=" + std::to_string(n));
    env_store.push_back("HMC_ROOT=" + id->to_string());
    std::vector<char*> envp;
    for (auto& s : env_store) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_store = {"/proc/self/exe"};
    arg_store.insert(arg_store.end(), worker_args.begin(), worker_args.end());
    std::vector<char*> argv;
    for (auto& s : arg_store) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      std::perror("hmc-probe: spawn");
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return 1;
    }
    pids.push_back(pid);
  }
  // Reap everyone; past the deadline, kill the rest.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int worst = 0, left = n;
  while (left > 0) {
    for (auto& p : pids) {
      if (p < 0) continue;
      int st = 0;
      if (waitpid(p, &st, WNOHANG) != p) continue;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code && !worst) worst = code;
      p = -1;
      --left;
    }
    if (left && std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "hmc-probe: ranks still running after %d s; killing them\n", timeout_s);
      for (auto& p : pids)
        if (p > 0) kill(p, SIGKILL), waitpid(p, nullptr, 0), p = -1;
      return 124;
    }
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return worst;
}

}  // namespace hmc::probe
