// Scratch memory of one collective, on the device of the user's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hmc/memory.h"
#include "hmc/status.h"
#include "hmc/types.h"

namespace hmc::core {
class ContextImpl;
}

namespace hmc::coll {

class Scratch {
 public:
  Scratch(core::ContextImpl& ctx, DeviceId device) : ctx_(ctx), device_(std::move(device)) {}
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
  std::vector<std::unique_ptr<uint8_t, HeapFree>> heap_;
  std::vector<Memory> device_mem_;
};

}  // namespace hmc::coll
