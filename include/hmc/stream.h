// A device stream made by a device provider, for code that has no vendor runtime of its
// own: hmc-bench --stream, tests, an application that only speaks HMC. native() is what
// CollOptions::stream takes. Code that already has streams (a cudaStream_t from PyTorch)
// passes those directly and needs none of this.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <utility>

#include "hmc/context.h"
#include "hmc/status.h"
#include "hmc/types.h"

namespace hmc {
namespace core {
class ContextImpl;
struct LoadedProvider;
}  // namespace core

class Stream {
 public:
  // A new stream on `device`; kUnsupported where its provider has no streams (cpu).
  static Result<Stream> create(Context& ctx, const DeviceId& device);
  Stream() = default;
  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // Waits up to HMC_TIMEOUT for the work queued on it, then destroys it. Must not outlive
  // the Context.
  ~Stream() { reset(); }
  void reset();

  void* native() const { return stream_; }
  const DeviceId& device() const { return device_; }

  // Queues a copy behind the work already on the stream: between this provider's device
  // memory and host memory, or within its devices. Host memory at either end should be
  // pinned (AllocKind::kPinnedHost): a vendor runtime may copy pageable memory on the
  // calling thread, which then waits for everything queued before the copy.
  Status copy(void* dst, const void* src, std::size_t bytes);
  // true once every operation queued so far has finished; an error the stream hit.
  Result<bool> idle() const;
  // Until every operation queued so far has finished, polling; kTimeout after `timeout`
  // (default HMC_TIMEOUT), the stream's error where it failed.
  Status synchronize(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;

 private:
  core::ContextImpl* ctx_ = nullptr;
  core::LoadedProvider* provider_ = nullptr;
  DeviceId device_;
  void* stream_ = nullptr;
};

}  // namespace hmc
