#include "common/put_fence.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace hmc_net {
namespace {

// Whether the task whose stat file this is has exited (Z, X); false when unreadable.
bool task_exited(const std::filesystem::path& stat_file) {
  std::ifstream stat(stat_file);
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

}  // namespace

// A zombie leader with threads still running is a process whose main thread called
// pthread_exit: its other threads may still be copying a put step.
bool process_gone(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::filesystem::path proc = "/proc/" + std::to_string(pid);
  if (!task_exited(proc / "stat")) return false;
  std::error_code ec;  // the directory may go while it is read (the process reaped): never throw
  for (std::filesystem::directory_iterator it(proc / "task", ec), end; !ec && it != end; it.increment(ec))
    if (!task_exited(it->path() / "stat")) return false;
  return true;
}

void PutFence::closed(Ring r) {
  if (!r.ring || !r.ring->shut_puts()) return;  // no step under way: none can begin now
  std::lock_guard lock(mu_);
  prune_locked();
  closing_.push_back(std::move(r));
}

void PutFence::prune_locked() {
  std::erase_if(closing_, [](const Ring& r) { return r.ring->put_region() == 0 || process_gone(r.writer); });
}

void PutFence::wait(uint64_t id, std::vector<Ring> marked, Host& host) {
  {
    std::lock_guard lock(mu_);
    prune_locked();
    for (const Ring& r : closing_)
      if (marks(*r.ring, id)) marked.push_back(r);
  }
  for (const Ring& r : marked) settle(r, id + 1, host);
}

void PutFence::drain(Host& host) {
  std::vector<Ring> rings;
  {
    std::lock_guard lock(mu_);
    rings.swap(closing_);
  }
  for (const Ring& r : rings) settle(r, 0, host);
}

// Returns once `r` shows no step into region `mark` - 1 (mark 0: no step at all).
void PutFence::settle(const Ring& r, uint64_t mark, Host& host) {
  auto running = [&] {
    const uint64_t v = r.ring->put_region();
    return mark == 0 ? v != 0 : v == mark;
  };
  const int64_t start = SharedRing::now_ns();
  for (int spins = 0; running(); ++spins) {
    const int64_t waited = SharedRing::now_ns() - start;
    if (waited > 1'000'000 && process_gone(r.writer)) return;  // died in the step: it writes no more
    if (waited > kPatienceNs) {
      const std::string what = mark == 0 ? "memory of this process" : "region " + std::to_string(mark - 1);
      host.log(HMC_LOG_ERROR, "a put from process " + std::to_string(r.writer) + " into " + what +
                                  " has not finished after " + std::to_string(kPatienceNs / 1'000'000'000) +
                                  " s; going on while it may still write there");
      return;
    }
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace hmc_net
