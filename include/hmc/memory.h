// Memory: an allocation on some device of some provider (move-only, frees itself).
#pragma once

#include <cstddef>
#include <memory>

#include "hmc/types.h"

namespace hmc {

namespace core {
class ContextImpl;
}

enum class AllocKind {
  kDefault,     // the device's own memory (host memory for cpu)
  kPinnedHost,  // page-locked host memory for fast staging
  kShareable,   // memory other processes of this host can map
};

class Memory {
 public:
  Memory() = default;
  Memory(core::ContextImpl* ctx, DeviceId device, void* ptr, std::size_t bytes, AllocKind kind)
      : ctx_(ctx), device_(std::move(device)), ptr_(ptr), bytes_(bytes), kind_(kind) {}
  Memory(Memory&& o) noexcept { *this = std::move(o); }
  Memory& operator=(Memory&& o) noexcept;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() { reset(); }

  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  const DeviceId& device() const { return device_; }
  AllocKind kind() const { return kind_; }
  void reset();

 private:
  core::ContextImpl* ctx_ = nullptr;
  DeviceId device_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  AllocKind kind_ = AllocKind::kDefault;
};

}  // namespace hmc
