// --local N: this process hosts the bootstrap root and runs N copies of itself as ranks
// (HMC_ROOT=<unique id>, HMC_RANK, HMC_WORLD_SIZE), then reaps them. A rank that fails
// gives the others a grace period before they are killed; nothing outlives the deadline,
// nor this process: SIGINT, SIGTERM and SIGHUP kill the ranks before it ends.
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>

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

// This program's path, the ranks' argv[0] (ps shows it; they are started from
// /proc/self/exe, this very binary even when the file was replaced since).
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

// The signals that end this process while it waits for its ranks: blocked here and taken
// with sigtimedwait, so that they kill the ranks first; the ranks start with none blocked.
sigset_t ending_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  return set;
}

pid_t spawn(char** argv, char** envp) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, "/proc/self/exe", nullptr, &attr, argv, envp);
  posix_spawnattr_destroy(&attr);
  if (err != 0) errno = err;
  return err == 0 ? pid : -1;
}

// Waits for the ranks. Returns the first failing rank's exit code (128 + signal for one
// killed), 124 after timeout_s, or 128 + the signal that ended this process's wait.
int reap(const char* tool, std::vector<pid_t>& pids, int timeout_s, const sigset_t& ending) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int worst = 0;
  std::size_t left = pids.size();
  while (left > 0) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      int st = 0;
      if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      if (WIFSIGNALED(st))
        std::fprintf(stderr, "%s: rank %zu was killed by signal %d (%s)\n", tool, r, WTERMSIG(st), strsignal(WTERMSIG(st)));
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code && !worst) {
        worst = code;
        deadline = std::min(deadline, Clock::now() + kGraceAfterFailure);
      }
      pids[r] = -1;
      --left;
    }
    if (left == 0) break;
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "%s: %zu rank(s) still running %s; killing them\n", tool, left,
                   worst ? "after another rank failed" : ("after " + std::to_string(timeout_s) + " s").c_str());
      kill_all(pids);
      return worst ? worst : 124;
    }
    const timespec tick{0, 10'000'000};
    if (const int sig = sigtimedwait(&ending, nullptr, &tick); sig > 0) {
      std::fprintf(stderr, "%s: %s; killing %zu rank(s)\n", tool, strsignal(sig), left);
      kill_all(pids);
      return 128 + sig;
    }
  }
  return worst;
}

// Starts the ranks and waits for them (reap).
int start_and_reap(const char* tool, int n, const std::vector<std::string>& args, int timeout_s, const sigset_t& ending) {
  auto ctx = Context::create();
  if (!ctx) return std::fprintf(stderr, "%s: %s\n", tool, ctx.status().to_string().c_str()), 1;
  auto id = ctx->create_unique_id();
  if (!id) return std::fprintf(stderr, "%s: %s\n", tool, id.status().to_string().c_str()), 1;

  std::vector<pid_t> pids;
  const std::string path = self_path();
  for (int r = 0; r < n; ++r) {
    auto env = rank_env(r, n, id->to_string());
    std::vector<std::string> argv_store = {path};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    auto envp = pointers(env);
    auto argv = pointers(argv_store);
    const pid_t pid = spawn(argv.data(), envp.data());
    if (pid < 0) {
      std::fprintf(stderr, "%s: cannot start rank %d: %s\n", tool, r, std::strerror(errno));
      kill_all(pids);
      return 1;
    }
    pids.push_back(pid);
  }
  return reap(tool, pids, timeout_s, ending);
}

}  // namespace

void name_this_process(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  prctl(PR_SET_NAME, slash ? slash + 1 : argv0, 0, 0, 0);
}

int run_local_ranks(const char* tool, int n, const std::vector<std::string>& args, int timeout_s) {
  // Blocked before the context starts its threads, which inherit the mask: a signal
  // delivered to one of them would end this process with the ranks left running.
  const sigset_t ending = ending_signals();
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, &ending, &before);
  const int worst = start_and_reap(tool, n, args, timeout_s, ending);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return worst;
}

}  // namespace hmc::tools

