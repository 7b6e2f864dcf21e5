// Scratch memory of one collective, on the device of the user's buffers, and the pool of
// device blocks a communicator keeps for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hmc/memory.h"
#include "hmc/status.h"
#include "hmc/types.h"

namespace hmc::core {
class ContextImpl;
struct LoadedProvider;
}

namespace hmc::coll {

// Device blocks reused by one communicator's collectives. Freeing device memory waits for
// the whole device on CUDA (cudaFree), which stalls behind any stream that waits for an
// HMC flag (a stream-ordered collective) and so could deadlock; allocating also costs more
// than a small collective. Blocks come in powers of two and are freed with the pool.
//
// Large host blocks are kept too: glibc serves 32 MiB and more straight from mmap and
// unmaps it on free, so an in-place all_to_all of 64 MiB faulted its 32 MiB of scratch in
// afresh on every call (perf: a sixth of the time in page faults). Blocks of kHostKeepMin
// or more are heap memory in powers of two; at most kHostKept of them stay.
class ScratchPool {
 public:
  static constexpr std::size_t kHostKeepMin = std::size_t{1} << 20;
  static constexpr std::size_t kHostKept = 4;

  Result<Memory> take(core::ContextImpl& ctx, const DeviceId& device, std::size_t bytes);
  void give(Memory block);
  // A kept host block of at least `bytes` (its size in `size`), or null.
  uint8_t* take_host(std::size_t bytes, std::size_t& size);
  // Keeps a host block for later, or frees it when kHostKept are kept already.
  void give_host(uint8_t* block, std::size_t size);
  // A host block of at least `bytes` registered with `p` (host_register), for the copies
  // of stream-ordered collectives (stream_stage.h); its size in `size`. A kept block that
  // fits is reused; a new one is made while the pool's blocks stay within `limit` bytes.
  // Past it, while a block is taken: null (ok), and the caller retries once its earlier
  // calls gave theirs back (a block leaked after a provider failure never comes back and
  // keeps counting). Past it with none taken: kept blocks are unregistered and freed, the
  // largest first, until the new one fits or none is left (one call may exceed `limit`).
  // Unregistering waits for all the device's queued work (cudaHostUnregister does, as
  // cudaFree does), so it happens only then, when no stream waits on this communicator:
  // blocks otherwise stay registered while kept.
  Result<uint8_t*> take_staging(core::LoadedProvider* p, std::size_t bytes, std::size_t limit, std::size_t& size);
  void give_staging(core::LoadedProvider* p, uint8_t* block, std::size_t size);
  ~ScratchPool();

 private:
  struct Staging {
    core::LoadedProvider* p;
    uint8_t* block;
    std::size_t size;
  };
  // Unregisters and frees a block no call holds (leaks it if unregistering fails).
  static void release_staging(const Staging& st);
  std::mutex mu_;
  std::vector<Memory> free_;
  std::vector<std::pair<uint8_t*, std::size_t>> host_;
  std::vector<Staging> staging_;   // kept staging blocks
  std::size_t staging_bytes_ = 0;  // every staging block's size, kept or taken
  int staging_taken_ = 0;
};

class Scratch {
 public:
  // `pool` serves device scratch and large host blocks (may be null: then every block is
  // allocated and freed).
  Scratch(core::ContextImpl& ctx, DeviceId device, std::shared_ptr<ScratchPool> pool = nullptr)
      : ctx_(ctx), device_(std::move(device)), pool_(std::move(pool)) {}
  Scratch(Scratch&&) = default;
  ~Scratch();

  // A new region of `bytes`, aligned for every dtype, owned until the collective ends.
  Result<uint8_t*> get(std::size_t bytes);
  // Gives the memory up without freeing it: a failed collective may leave receives posted
  // into it, and a late message must not land in freed memory.
  void leak();
  // Memory the collective uses that someone else owns too (a stream's host staging): it
  // is released with the scratch, or never when the scratch is leaked.
  void hold(std::shared_ptr<void> owner) { held_.push_back(std::move(owner)); }

  // Frees a host block (aligned operator new).
  struct HeapFree {
    void operator()(uint8_t* p) const;
  };

 private:
  core::ContextImpl& ctx_;
  DeviceId device_;
  std::shared_ptr<ScratchPool> pool_;
  std::vector<std::pair<std::unique_ptr<uint8_t, HeapFree>, std::size_t>> heap_;  // block, size
  std::vector<Memory> device_mem_;
  std::vector<std::shared_ptr<void>> held_;
};

}  // namespace hmc::coll
