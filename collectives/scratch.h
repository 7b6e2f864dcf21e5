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
}

namespace hmc::coll {

// Device blocks reused by one communicator's collectives. Freeing device memory waits for
// the whole device on CUDA (cudaFree), which stalls behind any stream that waits for an
// HMC flag (a stream-ordered collective) and so could deadlock; allocating also costs more
// than a small collective. Blocks come in powers of two and are freed with the pool.
class ScratchPool {
 public:
  Result<Memory> take(core::ContextImpl& ctx, const DeviceId& device, std::size_t bytes);
  void give(Memory block);

 private:
  std::mutex mu_;
  std::vector<Memory> free_;
};

class Scratch {
 public:
  // `pool` serves device scratch (may be null: then every block is allocated and freed).
  Scratch(core::ContextImpl& ctx, DeviceId device, std::shared_ptr<ScratchPool> pool = nullptr)
      : ctx_(ctx), device_(std::move(device)), pool_(std::move(pool)) {}
  Scratch(Scratch&&) = default;
  ~Scratch();

  // A new region of `bytes`, aligned for every dtype, owned until the collective ends.
  Result<uint8_t*> get(std::size_t bytes);
  // Gives the memory up without freeing it: a failed collective may leave receives posted
  // into it, and a late message must not land in freed memory.
  void leak();

 private:
  struct HeapFree {
    void operator()(uint8_t* p) const;
  };
  core::ContextImpl& ctx_;
  DeviceId device_;
  std::shared_ptr<ScratchPool> pool_;
  std::vector<std::unique_ptr<uint8_t, HeapFree>> heap_;
  std::vector<Memory> device_mem_;
};

}  // namespace hmc::coll
