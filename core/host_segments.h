// HostSegments: one shared-memory segment (about 1 MiB) per rank of a communicator whose
// ranks all run on this host with no device but the CPU, each mapped by every rank. The
// collectives layer runs all_reduce, reduce, all_gather, all_to_all, reduce_scatter,
// broadcast and barrier through them (collectives/shm_coll.h) instead of messages.
//
// Each rank's segment is a shareable host allocation of its own, made by the cpu provider
// itself (memfd memory; not through Context::alloc, which may hand host memory to a net
// provider), exported and imported through the cpu provider's IPC, as device_path.cpp
// does for GPUs. Users hold it by shared_ptr: the mappings outlive the communicator while a
// collective still refers to them. fail() and lose() record why a collective may stop
// waiting on them (the communicator aborted, a peer lost); users check while they wait.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "hmc/status.h"

namespace hmc::core {

struct LoadedProvider;

class HostSegments {
 public:
  // Layout, filled by collectives/shm_coll.cpp: a word on its own cache line (the last
  // round this rank finished; the line also holds kPidOff and kSelfOff), then two slots,
  // each a header of two words on their own lines (the first line also carries a tiny
  // collective's data) and kSlotBytes of data. Bigger slots mean fewer rounds: 2 MiB
  // all_reduce on 2 ranks took 450 us with 64 KiB slots and 190 us with 512 KiB
  // (docs/performance.md).
  static constexpr std::size_t kSlotBytes = 512 << 10;
  static constexpr std::size_t kPidOff = 8;    // the owner's pid (int64)
  static constexpr std::size_t kSelfOff = 16;  // the segment's address in its owner (uint64)
  // Then a line for sleeping (below): the owner's bell, a futex word, and how many of the
  // owner's threads sleep on it. Written only around sleeps, so ring_peers reads it cheaply.
  static constexpr std::size_t kBellOff = 64;      // uint32
  static constexpr std::size_t kSleepersOff = 68;  // uint32
  static constexpr std::size_t kHeader = 128;      // the two lines above; zeroed at creation
  static constexpr std::size_t kSlotHeader = 128;
  static constexpr std::size_t slot_off(uint64_t b) { return kHeader + b * (kSlotHeader + kSlotBytes); }
  static constexpr std::size_t kBytes = kHeader + 2 * (kSlotHeader + kSlotBytes);

  // `own`: this rank's segment, from cpu's mem_alloc; freed with it.
  HostSegments(LoadedProvider* cpu, void* own, int rank, int size);
  ~HostSegments();
  HostSegments(const HostSegments&) = delete;
  HostSegments& operator=(const HostSegments&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(base_.size()); }
  uint8_t* of(int rank) const { return base_[rank]; }
  // Whether every rank can read every other's memory with process_vm_readv (agreed at
  // setup, alike on every rank), and the process to read rank r's from.
  bool cma() const { return cma_; }
  int pid(int rank) const { return pids_[rank]; }
  // Why collectives may stop waiting on them: fail() for this rank's own end (finalize,
  // abort), lose() for a peer lost. Both ring the own bell: sleepers see it at once.
  void fail(const Status& why);
  void lose(int rank, const Status& why);
  bool any_failure() const { return has_failed_.load(std::memory_order_acquire); }  // either
  Status stopped() const;     // fail()'s first reason, or ok
  Status loss() const;        // lose()'s first reason, or ok
  bool lost(int rank) const;  // whether lose() named this rank

  // Sleeping until a peer writes (ProgressEngine::wait_until). A waiter takes the bell's
  // value and counts itself in (begin_sleep), checks once more what it waits for, then
  // sleeps unless the bell rang since (sleep), and counts itself out (end_sleep). A rank
  // that wrote what a peer may wait for calls ring_peers: it rings every peer with a
  // sleeper. Both sides order the count and the data with seq_cst, so a write is either
  // seen by the last check or followed by a ring. The owner's own wakes (a provider's
  // completion, a failure) ring with ring_own.
  uint32_t begin_sleep();
  void sleep(uint32_t seen, std::chrono::microseconds at_most);
  void end_sleep();
  void ring_peers();
  void ring_own() { ring(rank_); }
  // This process's collectives pending on these segments (ProgressEngine::segment_waits):
  // adds `delta`, returns the new count.
  int count_pending(int delta) { return pending_.fetch_add(delta, std::memory_order_acq_rel) + delta; }
  bool pending() const { return pending_.load(std::memory_order_acquire) > 0; }

 private:
  friend class CommImpl;
  std::atomic_ref<uint32_t> word32(int rank, std::size_t off) const {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(base_[rank] + off));
  }
  void ring(int rank);
  LoadedProvider* cpu_;
  void* own_;
  int rank_;
  std::vector<uint8_t*> base_;     // per rank; own_ at rank_
  std::vector<void*> imported_;    // what ipc_close must release
  std::vector<int> pids_;
  bool cma_ = false;
  std::atomic<bool> has_failed_{false};   // polled by every wait; what mu_ guards only once set
  std::atomic<bool> has_stopped_{false};  // fail() was called
  std::atomic<int> pending_{0};
  mutable std::mutex mu_;
  Status stopped_, loss_;
  std::vector<bool> lost_;
};

}  // namespace hmc::core
