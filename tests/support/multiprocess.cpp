#include "multiprocess.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

namespace hmc::test {
namespace {

bool write_all(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  if (write(fd, &n, 4) != 4) return false;
  return write(fd, s.data(), n) == static_cast<ssize_t>(n);
}

bool read_all(int fd, std::string& s, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  uint32_t n = 0;
  if (read(fd, &n, 4) != 4 || n > 4096) return false;
  s.resize(n);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, s.data() + got, n - got);
    if (r <= 0) return false;
    got += r;
  }
  return true;
}

}  // namespace

std::string RankExit::describe() const {
  std::string s = "rank " + std::to_string(rank) + ": ";
  if (timed_out) return s + "timed out (killed)";
  if (signal) return s + "killed by signal " + std::to_string(signal);
  return s + "exit " + std::to_string(exit_code);
}

bool all_ok(const std::vector<RankExit>& exits) {
  return std::all_of(exits.begin(), exits.end(), [](const RankExit& e) { return e.exit_code == 0; });
}

std::string describe(const std::vector<RankExit>& exits) {
  std::string s;
  for (const auto& e : exits) s += e.describe() + "; ";
  return s;
}

std::vector<RankExit> run_processes(int n, const std::function<int(int)>& body, std::chrono::seconds deadline) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  std::vector<RankExit> exits(n);
  auto until = std::chrono::steady_clock::now() + deadline;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == 0) continue;
      exits[r].rank = r;
      if (got > 0 && WIFEXITED(status)) exits[r].exit_code = WEXITSTATUS(status);
      if (got > 0 && WIFSIGNALED(status)) exits[r].signal = WTERMSIG(status);
      pids[r] = -1;
      --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > until) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] < 0) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        exits[r] = {r, -1, SIGKILL, true};
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exits;
}

std::vector<RankExit> run_ranks(int size, const std::map<std::string, std::string>& settings,
                                const std::function<int(RankEnv&)>& body, std::chrono::seconds deadline) {
  // One pipe per non-zero rank carries the unique id from rank 0.
  std::vector<std::array<int, 2>> pipes(size);
  for (auto& p : pipes)
    if (pipe(p.data()) != 0) return {{0, 99, 0, false}};
  auto exits = run_processes(size, [&](int rank) -> int {
    ContextOptions opts{settings};
    for (auto& [name, value] : opts.settings) {
      auto at = value.find("{rank}");
      if (at != std::string::npos) value.replace(at, 6, std::to_string(rank));
    }
    auto ctx = Context::create(opts);
    if (!ctx) {
      std::fprintf(stderr, "[rank %d] context: %s\n", rank, ctx.status().to_string().c_str());
      return 2;
    }
    UniqueId id;
    if (rank == 0) {
      auto made = ctx->create_unique_id();
      if (!made) {
        std::fprintf(stderr, "[rank 0] unique id: %s\n", made.status().to_string().c_str());
        return 2;
      }
      id = made.value();
      for (int r = 1; r < size; ++r) write_all(pipes[r][1], id.to_string());
    } else {
      std::string text;
      if (!read_all(pipes[rank][0], text, 30000)) return 3;
      id = UniqueId::parse(text).value();
    }
    auto comm = Communicator::create(ctx.value(), id, rank, size);
    if (!comm) {
      std::fprintf(stderr, "[rank %d] communicator: %s\n", rank, comm.status().to_string().c_str());
      return 4;
    }
    RankEnv env{rank, size, ctx.value(), comm.value()};
    int rc = body(env);
    if (rc == 0) {
      Status s = comm->finalize();
      if (!s.ok() && s.code() != ErrorCode::kFinalized && s.code() != ErrorCode::kAborted) {
        std::fprintf(stderr, "[rank %d] finalize: %s\n", rank, s.to_string().c_str());
        return 5;
      }
    }
    return rc;
  }, deadline);
  for (auto& p : pipes) {
    close(p[0]);
    close(p[1]);
  }
  return exits;
}

std::vector<uint8_t> random_bytes(std::size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 g(seed * 0x9e3779b97f4a7c15ull + 12345);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = g();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(g());
  return v;
}

__attribute__((no_sanitize("thread"))) bool landed(const void* live, const void* want, std::size_t n) {
  const volatile auto* a = static_cast<const volatile uint8_t*>(live);
  const auto* b = static_cast<const uint8_t*>(want);
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

std::vector<std::string> available_net_providers() {
  // Asked in a child: a vendor runtime a device provider initialises (CUDA) would not
  // survive into the ranks this process forks later. One name per line on a pipe.
  int fds[2];
  if (pipe(fds) != 0) return {};
  auto exits = run_processes(1, [&](int) {
    close(fds[0]);
    auto ctx = Context::create();
    if (!ctx) return 1;
    std::string names;
    for (const auto& p : ctx->providers())
      if (p.kind == "net" && p.available) names += p.name + "\n";
    return write(fds[1], names.data(), names.size()) == static_cast<ssize_t>(names.size()) ? 0 : 1;
  }, std::chrono::seconds(60));
  close(fds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  std::vector<std::string> out;
  if (!all_ok(exits)) return out;
  for (std::size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(text.substr(at, nl - at));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace hmc::test
