// --local N: this process hosts the bootstrap root and runs N copies of itself as ranks
// (HMC_ROOT=<unique id>, HMC_RANK, HMC_WORLD_SIZE), then reaps them. A rank that fails
// gives the others a grace period before they are killed; nothing outlives the deadline.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

#include "local_ranks.h"

#include "hmc/hmc.h"

extern char** environ;

namespace hmc::tools {
namespace {

constexpr auto kGraceAfterFailure = std::chrono::seconds(10);

std::vector<std::string> rank_env(int rank, int n, const std::string& root) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv = *e;
    if (kv.starts_with("HMC_RANK=") || kv.starts_with("HMC_WORLD_SIZE=") || kv.starts_with("HMC_ROOT=")) continue;
    std::string var(kv);
    // HMC_HOST_ID=host-{rank} makes each rank look like a host of its own (staged paths, tcp).
    if (var.starts_with("HMC_"))
      for (auto at = var.find("{rank}"); at != std::string::npos; at = var.find("{rank}", at))
        var.replace(at, 6, std::to_string(rank));
    env.push_back(std::move(var));
  }
  env.push_back("HMC_RANK=" + std::to_string(rank));
  env.push_back("HMC_WORLD_SIZE=" + std::to_string(n));
  env.push_back("HMC_ROOT=" + root);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// This program's path, so that ps shows the ranks by name (they are started from /proc/self/exe).
std::string self_path() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : "hmc-rank";
}

void kill_all(std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (p > 0) kill(p, SIGKILL);
  for (pid_t& p : pids)
    if (p > 0) waitpid(p, nullptr, 0), p = -1;
}

}  // namespace

int run_local_ranks(const char* tool, int n, const std::vector<std::string>& args, int timeout_s) {
  auto ctx = Context::create();
  if (!ctx) return std::fprintf(stderr, "%s: %s\n", tool, ctx.status().to_string().c_str()), 1;
  auto id = ctx->create_unique_id();
  if (!id) return std::fprintf(stderr, "%s: %s\n", tool, id.status().to_string().c_str()), 1;

  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    auto env = rank_env(r, n, id->to_string());
    std::vector<std::string> argv_store = {self_path()};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    auto envp = pointers(env);
    auto argv = pointers(argv_store);
    pid_t pid = 0;
    if (int err = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()); err != 0) {
      std::fprintf(stderr, "%s: cannot start rank %d: %s\n", tool, r, std::strerror(err));
      kill_all(pids);
      return 1;
    }
    pids.push_back(pid);
  }

  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int worst = 0, left = n;
  while (left > 0) {
    for (pid_t& p : pids) {
      int st = 0;
      if (p <= 0 || waitpid(p, &st, WNOHANG) != p) continue;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code && !worst) {
        worst = code;
        deadline = std::min(deadline, Clock::now() + kGraceAfterFailure);
      }
      p = -1;
      --left;
    }
    if (left == 0) break;
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "%s: %d rank(s) still running %s; killing them\n", tool, left,
                   worst ? "after another rank failed" : ("after " + std::to_string(timeout_s) + " s").c_str());
      kill_all(pids);
      return worst ? worst : 124;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return worst;
}

}  // namespace hmc::tools
