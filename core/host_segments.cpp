#include "core/host_segments.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <cstring>

#include "core/comm_impl.h"
#include "core/log.h"
#include "core/plugin_registry.h"

namespace hmc::core {

HostSegments::HostSegments(LoadedProvider* cpu, void* own, int rank, int size)
    : cpu_(cpu), own_(own), rank_(rank), base_(size, nullptr), pids_(size, 0), lost_(size, false) {
  base_[rank] = static_cast<uint8_t*>(own);
}

HostSegments::~HostSegments() {
  for (void* p : imported_) cpu_->dev->ipc_close(cpu_->state, p);
  cpu_->dev->mem_free(cpu_->state, 0, own_);
}

void HostSegments::fail(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (!stopped_.ok()) return;
    stopped_ = why;
    has_stopped_.store(true, std::memory_order_release);
    has_failed_.store(true, std::memory_order_release);
  }
  ring_own();
}

void HostSegments::lose(int rank, const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (lost_[rank]) return;
    lost_[rank] = true;
    if (loss_.ok()) loss_ = why;
    has_failed_.store(true, std::memory_order_release);
  }
  ring_own();
}

Status HostSegments::stopped() const {
  if (!has_stopped_.load(std::memory_order_acquire)) return {};  // every pass after a loss asks
  std::lock_guard lock(mu_);
  return stopped_;
}

Status HostSegments::loss() const {
  if (!any_failure()) return {};
  std::lock_guard lock(mu_);
  return loss_;
}

bool HostSegments::lost(int rank) const {
  if (!any_failure()) return false;
  std::lock_guard lock(mu_);
  return lost_[rank];
}

uint32_t HostSegments::begin_sleep() {
  const uint32_t seen = word32(rank_, kBellOff).load(std::memory_order_acquire);
  word32(rank_, kSleepersOff).fetch_add(1, std::memory_order_seq_cst);
  return seen;
}

void HostSegments::sleep(uint32_t seen, std::chrono::microseconds at_most) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at_most).count();
  const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // A shared futex (no FUTEX_PRIVATE_FLAG): the peers that ring it are other processes.
  // EAGAIN (rang already), EINTR and ETIMEDOUT all just end the sleep.
  syscall(SYS_futex, base_[rank_] + kBellOff, FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

void HostSegments::end_sleep() { word32(rank_, kSleepersOff).fetch_sub(1, std::memory_order_relaxed); }

void HostSegments::ring_peers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the data written before, then the counts
  for (int r = 0; r < size(); ++r)
    if (r != rank_ && word32(r, kSleepersOff).load(std::memory_order_relaxed) != 0) ring(r);
}

void HostSegments::ring(int rank) {
  word32(rank, kBellOff).fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, base_[rank] + kBellOff, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Every rank decides from the same cards whether to try; then each exports its segment,
// imports everyone else's, and all agree on the outcome, so either every rank has the
// segments or none has.
Status CommImpl::setup_segments(const Card& mine, Clock::time_point deadline) {
  auto host_only = [](const Card& c) {
    return std::all_of(c.devices.begin(), c.devices.end(), [](const DeviceInfo& d) { return d.id.provider == "cpu"; });
  };
  bool want = size_ >= 2 && ctx_.config().flag("HMC_SHM_COLL");
  for (const auto& p : peers_) want = want && p.card.host_id == mine.host_id && host_only(p.card);
  LoadedProvider* cpu = ctx_.registry().device("cpu");
  if (!want || !cpu || !(cpu->dev->caps & HMC_DEV_CAP_IPC)) return {};

  std::string why;
  std::vector<uint8_t> handle(HMC_IPC_HANDLE_MAX);
  std::size_t len = 0;
  void* own = nullptr;
  if (cpu->dev->mem_alloc(cpu->state, 0, HostSegments::kBytes, HMC_ALLOC_SHAREABLE, &own) != 0 || !own)
    why = "allocation: " + provider_error(*cpu);
  else if (cpu->dev->ipc_export(cpu->state, own, HostSegments::kBytes, handle.data(), handle.size(), &len) != 0)
    why = "export: " + provider_error(*cpu);
  std::shared_ptr<HostSegments> segs;
  if (own) {
    // Only the words: data pages are touched, and committed, as collectives use them.
    std::memset(own, 0, HostSegments::kHeader);
    const int64_t pid = getpid();
    const uint64_t self = reinterpret_cast<uintptr_t>(own);
    std::memcpy(static_cast<uint8_t*>(own) + HostSegments::kPidOff, &pid, sizeof(pid));
    std::memcpy(static_cast<uint8_t*>(own) + HostSegments::kSelfOff, &self, sizeof(self));
    for (uint64_t b = 0; b < 2; ++b)
      std::memset(static_cast<uint8_t*>(own) + HostSegments::slot_off(b), 0, HostSegments::kSlotHeader);
    segs = std::make_shared<HostSegments>(cpu, own, rank_, size_);  // frees own when dropped
  }
  handle.resize(why.empty() ? len : 0);
  auto handles = bootstrap_->allgather(handle, deadline);
  if (!handles) return handles.status();
  if (why.empty()) {
    for (int r = 0; r < size_ && why.empty(); ++r) {
      const auto& h = handles.value()[r];
      if (r == rank_) continue;
      void* ptr = nullptr;
      if (h.empty()) why = "rank " + std::to_string(r) + " has no segment";
      else if (cpu->dev->ipc_import(cpu->state, h.data(), h.size(), &ptr) != 0 || !ptr)
        why = "import from rank " + std::to_string(r) + ": " + provider_error(*cpu);
      else if (std::size_t mapped = 0; !(cpu->dev->caps & HMC_DEV_CAP_IPC_EXTENT) ||
                                        cpu->dev->ipc_extent(cpu->state, ptr, &mapped) != 0 ||
                                        mapped < HostSegments::kBytes) {
        // The collectives reach kBytes into every segment: a peer's handle that maps less
        // (another build, a lie) would have them write past the mapping.
        why = "rank " + std::to_string(r) + "'s segment maps " + std::to_string(mapped) + " bytes, not " +
              std::to_string(HostSegments::kBytes) + " (or the cpu provider cannot say)";
        cpu->dev->ipc_close(cpu->state, ptr);
      } else {
        segs->imported_.push_back(ptr);
        segs->base_[r] = static_cast<uint8_t*>(ptr);
      }
    }
  }
  auto verdicts = bootstrap_->allgather(std::vector<uint8_t>(why.begin(), why.end()), deadline);
  if (!verdicts) return verdicts.status();
  for (int r = 0; r < size_; ++r) {
    const auto& v = verdicts.value()[r];
    if (v.empty()) continue;
    HMC_LOG("coll", info, "rank {}: small collectives use messages: rank {} could not share its segment ({})", rank_, r,
            std::string(v.begin(), v.end()));
    return {};
  }
  // Cross-memory attach (collectives/shm_coll.cpp reads mid-size all_gather and all_to_all
  // blocks with it): each rank reads every peer's pid word through it; all must succeed, or
  // none uses it. Ranks in other pid namespaces fail here, not later.
  uint8_t cma = 1;
  for (int r = 0; r < size_; ++r) {
    int64_t pid = 0, seen = -1;
    uint64_t self = 0;
    std::memcpy(&pid, segs->of(r) + HostSegments::kPidOff, sizeof(pid));
    std::memcpy(&self, segs->of(r) + HostSegments::kSelfOff, sizeof(self));
    segs->pids_[r] = static_cast<int>(pid);
    if (r == rank_) continue;
    iovec local{&seen, sizeof(seen)}, remote{reinterpret_cast<void*>(self + HostSegments::kPidOff), sizeof(seen)};
    if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) != sizeof(seen) || seen != pid) cma = 0;
  }
  auto cmas = bootstrap_->allgather(std::vector<uint8_t>{cma}, deadline);
  if (!cmas) return cmas.status();
  segs->cma_ = std::all_of(cmas.value().begin(), cmas.value().end(), [](const auto& v) { return v.size() == 1 && v[0]; });
  if (!segs->cma_) HMC_LOG("coll", info, "rank {}: no cross-memory attach between this host's ranks", rank_);
  segments_ = std::move(segs);
  return {};
}

}  // namespace hmc::core
