// The public Stream: a device provider's stream_* functions behind an RAII handle.
#include <thread>
#include <utility>

#include "core/context_impl.h"
#include "hmc/stream.h"

namespace hmc {
namespace {

Status failed(const core::LoadedProvider& p, const std::string& what) {
  return {ErrorCode::kInternal, p.name + " " + what + ": " + core::provider_error(p)};
}

}  // namespace

Result<Stream> Stream::create(Context& ctx, const DeviceId& device) {
  if (!ctx.valid()) return core::empty_context("Stream::create");
  core::LoadedProvider* p = ctx.impl().registry().device(device.provider);
  if (!p) return Status(ErrorCode::kUnavailable, "no device provider '" + device.provider + "' is loaded");
  // cpu's stream tokens order nothing (its work is synchronous), and collectives refuse a
  // stream on host memory: no Stream for it.
  if (p->name == "cpu" || !(p->dev->caps & HMC_DEV_CAP_STREAMS))
    return Status(ErrorCode::kUnsupported, device.provider + " has no streams: its work is synchronous");
  Stream s;
  if (p->dev->stream_create(p->state, device.index, &s.stream_) != HMC_PROV_OK)
    return failed(*p, "stream_create on " + device.to_string());
  s.ctx_ = &ctx.impl();
  s.provider_ = p;
  s.device_ = device;
  return s;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::exchange(o.ctx_, nullptr);
    provider_ = std::exchange(o.provider_, nullptr);
    device_ = o.device_;
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

void Stream::reset() {
  if (!stream_) return;
  (void)synchronize();  // a provider may drop work still queued when its stream goes
  provider_->dev->stream_destroy(provider_->state, stream_);
  stream_ = nullptr;
  ctx_ = nullptr;
  provider_ = nullptr;
}

Status Stream::copy(void* dst, const void* src, std::size_t bytes) {
  if (!stream_) return {ErrorCode::kInvalidArgument, "copy on an empty Stream"};
  if (bytes == 0) return {};
  if (!dst || !src) return {ErrorCode::kInvalidArgument, "stream copy with a null pointer"};
  for (const void* end : {static_cast<const void*>(dst), src}) {
    const core::LoadedProvider* owner = ctx_->provider_of(end);
    if (owner != provider_ && owner->name != "cpu")
      return {ErrorCode::kUnsupported, "a " + provider_->name + " stream cannot copy " + owner->name + " memory"};
  }
  if (provider_->dev->copy(provider_->state, dst, src, bytes, stream_) != HMC_PROV_OK)
    return failed(*provider_, "copy of " + std::to_string(bytes) + " bytes on a stream");
  return {};
}

Result<bool> Stream::idle() const {
  if (!stream_) return Status(ErrorCode::kInvalidArgument, "idle() on an empty Stream");
  const int rc = provider_->dev->stream_query(provider_->state, stream_);
  if (rc == HMC_PROV_OK || rc == HMC_PROV_IN_PROGRESS) return rc == HMC_PROV_OK;
  return failed(*provider_, "stream_query");
}

Status Stream::synchronize(std::optional<std::chrono::milliseconds> timeout) const {
  const auto deadline = core::deadline_after(timeout.value_or(ctx_ ? ctx_->timeout() : std::chrono::milliseconds(0)));
  for (;;) {
    auto done = idle();
    if (!done) return done.status();
    if (done.value()) return {};
    if (core::Clock::now() > deadline)
      return {ErrorCode::kTimeout, "the " + device_.to_string() + " stream still had work queued at the deadline"};
    std::this_thread::yield();
  }
}

}  // namespace hmc
