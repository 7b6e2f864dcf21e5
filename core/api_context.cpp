// The public Context, Memory, MemoryRegion, Request and UniqueId: thin shells over core.
#include <cstdio>
#include <cstring>
#include <optional>

#include "core/bootstrap.h"
#include "core/context_impl.h"
#include "core/registration.h"
#include "hmc/context.h"
#include "hmc/memory_region.h"
#include "hmc/request.h"

namespace hmc {

Result<Context> Context::create(ContextOptions options) {
  auto impl = core::ContextImpl::create(options);
  if (!impl) return impl.status();
  return Context(std::move(impl.value()));
}
Context::Context(std::unique_ptr<core::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
Context::~Context() = default;

namespace core {
Status empty_context(const std::string& where) {
  return {ErrorCode::kInvalidArgument, where + ": context is empty (moved from)"};
}
}  // namespace core

std::vector<ProviderInfo> Context::providers() const {
  return impl_ ? impl_->registry().report() : std::vector<ProviderInfo>{};
}
std::vector<DeviceInfo> Context::devices() const { return impl_ ? impl_->devices() : std::vector<DeviceInfo>{}; }
std::vector<ConfigEntry> Context::config() const {
  return impl_ ? impl_->config().entries() : std::vector<ConfigEntry>{};
}
Result<Memory> Context::alloc(const DeviceId& device, std::size_t bytes, AllocKind kind) {
  if (!impl_) return core::empty_context("Context::alloc");
  return impl_->alloc(device, bytes, kind);
}
Status Context::copy(void* dst, const void* src, std::size_t bytes) {
  return impl_ ? impl_->copy(dst, src, bytes) : core::empty_context("Context::copy");
}
DeviceId Context::device_of(const void* ptr) const { return impl_ ? impl_->device_of(ptr) : DeviceId{}; }
Result<UniqueId> Context::create_unique_id() {
  if (!impl_) return core::empty_context("Context::create_unique_id");
  return impl_->create_unique_id();
}

Memory& Memory::operator=(Memory&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::exchange(o.ctx_, nullptr);
    device_ = o.device_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
  }
  return *this;
}

void Memory::reset() {
  if (ctx_ && ptr_) ctx_->free(device_, ptr_);
  ctx_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

MemoryRegion::MemoryRegion() = default;
MemoryRegion::MemoryRegion(std::unique_ptr<core::Registration> reg) : reg_(std::move(reg)) {}
MemoryRegion::MemoryRegion(MemoryRegion&&) noexcept = default;
MemoryRegion& MemoryRegion::operator=(MemoryRegion&&) noexcept = default;
MemoryRegion::~MemoryRegion() = default;
void* MemoryRegion::data() const { return reg_ ? reg_->data() : nullptr; }
std::size_t MemoryRegion::size() const { return reg_ ? reg_->size() : 0; }
RemoteKey MemoryRegion::pack() const { return reg_ ? RemoteKey{reg_->pack()} : RemoteKey{}; }

namespace {

// A wait of `op` until `given` (HMC_TIMEOUT without it) after `start`.
Status wait_op(const core::Operation* op, std::optional<std::chrono::milliseconds> given, Clock::time_point start) {
  if (!op) return {ErrorCode::kInvalidArgument, "wait on an empty request"};
  if (op->done()) return op->status();
  auto* engine = op->engine();
  const auto timeout = given.value_or(engine->default_timeout);
  // The context is gone: its providers (which a pass would poll) with it.
  if (engine->closed()) return {ErrorCode::kFinalized, "the context was destroyed while the operation was pending"};
  if (!engine->wait_until([&] { return op->done(); }, core::deadline_after(timeout, start))) {
    if (engine->closed()) return {ErrorCode::kFinalized, "the context was destroyed while the operation was pending"};
    if (timeout.count() <= 0) return {ErrorCode::kTimeout, "operation not finished (a wait of 0 ms or less only looks)"};
    const std::string what = op->describe();
    return {ErrorCode::kTimeout, (what.empty() ? "operation" : what) + " not finished after " +
                                     std::to_string(timeout.count()) + " ms" + (given ? "" : " (HMC_TIMEOUT)")};
  }
  return op->status();
}

}  // namespace

Status Request::wait() { return wait_op(op_.get(), std::nullopt, Clock::now()); }
Status Request::wait(std::chrono::milliseconds timeout) { return wait_op(op_.get(), timeout, Clock::now()); }

bool Request::test() {
  if (!op_) return true;
  if (!op_->done() && op_->engine() && !op_->engine()->closed()) op_->engine()->progress();
  return op_->done();
}

const std::shared_ptr<core::Operation>& core::op_of(const Request& r) { return r.op_; }

Status Request::status() const { return op_ ? op_->status() : Status{}; }
std::size_t Request::bytes() const { return op_ ? op_->bytes() : 0; }

// One deadline for all, counted from the call: each request's own HMC_TIMEOUT, or
// `timeout`. Past it, the rest are only looked at.
static Status wait_all(Request* requests, std::size_t n, std::optional<std::chrono::milliseconds> timeout) {
  const auto start = Clock::now();
  Status first;
  for (std::size_t i = 0; i < n; ++i) {
    Status s = wait_op(core::op_of(requests[i]).get(), timeout, start);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status wait_all(Request* requests, std::size_t n) { return wait_all(requests, n, std::nullopt); }
Status wait_all(Request* requests, std::size_t n, std::chrono::milliseconds timeout) {
  return wait_all(requests, n, std::optional(timeout));
}

std::string UniqueId::to_string() const {
  std::string hex;
  char b[3];
  for (uint8_t c : secret) {
    std::snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  return "hmc1:" + root + ":" + hex;
}

Result<UniqueId> UniqueId::parse(const std::string& text) {
  auto bad = [&](const char* why) {
    return Status(ErrorCode::kInvalidArgument, "malformed unique id '" + text + "': " + why);
  };
  if (text.rfind("hmc1:", 0) != 0) return bad("expected hmc1:<host>:<port>:<secret>");
  auto last = text.rfind(':');
  std::string hex = text.substr(last + 1);
  UniqueId id;
  id.root = text.substr(5, last - 5);
  const auto colon = id.root.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host and port");
  if (!core::parse_root(id.root)) return bad("the port is not a number from 1 to 65535");
  // sscanf's %x would also take blanks, signs and "0x", and stop at the first other character.
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return bad("secret must be 32 hex digits");
  for (std::size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return bad("secret is not hex");
    id.secret[i] = static_cast<uint8_t>(v);
  }
  return id;
}

}  // namespace hmc
