#include "core/device_path.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"

namespace hmc::core {
namespace {

constexpr uint32_t kOfferMagic = 0x4f50494d;  // "MIPO"

struct OfferHead {
  uint32_t magic;
  uint32_t handle_len;
  uint64_t alloc_id;
  uint64_t alloc_bytes;
  uint64_t offset;
  char provider[16];
};

// The provider that copies between `a` and `b`: a vendor's own for its memory, cpu for
// host to host; null when two vendors' memories meet (they need host staging).
LoadedProvider* copier(LoadedProvider* a, LoadedProvider* b) {
  if (a->name == "cpu") return b;
  if (b->name == "cpu" || a == b) return a;
  return nullptr;
}

}  // namespace

std::vector<uint8_t> encode_offer(const IpcOffer& offer) {
  OfferHead h{kOfferMagic, static_cast<uint32_t>(offer.handle.size()), offer.alloc_id, offer.alloc_bytes, offer.offset, {}};
  std::strncpy(h.provider, offer.provider.c_str(), sizeof(h.provider) - 1);
  std::vector<uint8_t> out(sizeof(h) + offer.handle.size());
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), offer.handle.data(), offer.handle.size());
  return out;
}

Result<IpcOffer> decode_offer(const uint8_t* data, std::size_t len) {
  OfferHead h;
  if (len < sizeof(h)) return Status(ErrorCode::kInternal, "short IPC offer");
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kOfferMagic || h.handle_len != len - sizeof(h) || h.handle_len > HMC_IPC_HANDLE_MAX ||
      h.provider[sizeof(h.provider) - 1] != 0 || h.offset > h.alloc_bytes)
    return Status(ErrorCode::kInternal, "garbled IPC offer");
  return IpcOffer{h.provider, h.alloc_id, h.alloc_bytes, h.offset, std::vector<uint8_t>(data + sizeof(h), data + len)};
}

std::optional<IpcOffer> DeviceTransfers::offer(const void* ptr, std::size_t bytes) {
  ContextImpl::MemInfo m = ctx_.mem_info(ptr, bytes);
  if (!m.alloc_id || !(m.provider->dev->caps & HMC_DEV_CAP_IPC)) return std::nullopt;
  if (!m.device_mem && m.kind != AllocKind::kShareable) return std::nullopt;
  auto it = exports_.find(m.alloc_id);
  if (it == exports_.end()) {
    std::vector<uint8_t> handle(HMC_IPC_HANDLE_MAX);
    std::size_t len = 0;
    auto* base = const_cast<uint8_t*>(m.base);
    if (m.provider->dev->ipc_export(m.provider->state, base, m.alloc_bytes, handle.data(), handle.size(), &len) != 0) {
      HMC_LOG("core", debug, "{} cannot export {} bytes for IPC ({}); staging instead", m.provider->name, m.alloc_bytes,
              provider_error(*m.provider));
      return std::nullopt;
    }
    handle.resize(len);
    if (exports_.size() >= 4096) exports_.clear();  // ids never repeat: dropping entries only costs re-exports
    it = exports_.emplace(m.alloc_id, std::move(handle)).first;
  }
  auto offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) - m.base);
  return IpcOffer{m.provider->name, m.alloc_id, m.alloc_bytes, offset, it->second};
}

Status DeviceTransfers::write(int peer, const IpcOffer& offer, const void* src, std::size_t bytes) {
  if (offer.offset + bytes > offer.alloc_bytes)
    return {ErrorCode::kOutOfBounds, "IPC write of " + std::to_string(bytes) + " bytes overruns the offered memory"};
  LoadedProvider* target = ctx_.registry().device(offer.provider);
  if (!target || !(target->dev->caps & HMC_DEV_CAP_IPC))
    return {ErrorCode::kUnsupported, "provider " + offer.provider + " is not loaded here with IPC"};
  auto key = std::make_pair(peer, offer.alloc_id);
  auto it = imports_.find(key);
  if (it == imports_.end()) {
    if (imports_.size() >= kMaxImports) {
      auto oldest = std::min_element(imports_.begin(), imports_.end(),
                                     [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
      oldest->second.provider->dev->ipc_close(oldest->second.provider->state, oldest->second.ptr);
      imports_.erase(oldest);
    }
    void* ptr = nullptr;
    if (target->dev->ipc_import(target->state, offer.handle.data(), offer.handle.size(), &ptr) != 0 || !ptr)
      return {ErrorCode::kUnsupported, "importing rank " + std::to_string(peer) + "'s " + offer.provider +
                                           " memory failed: " + provider_error(*target)};
    it = imports_.emplace(key, Import{target, ptr, 0}).first;
  }
  it->second.last_use = ++uses_;
  LoadedProvider* by = copier(target, ctx_.provider_of(src));
  if (!by) return {ErrorCode::kUnsupported, "no provider copies from " + ctx_.provider_of(src)->name + " into " + offer.provider};
  void* dst = static_cast<uint8_t*>(it->second.ptr) + offer.offset;
  if (by->dev->copy(by->state, dst, src, bytes, nullptr) != 0)
    return {ErrorCode::kInternal, "IPC copy of " + std::to_string(bytes) + " bytes by " + by->name + " failed: " + provider_error(*by)};
  return {};
}

Result<uint8_t*> DeviceTransfers::stage(const ContextImpl::MemInfo& near, std::size_t bytes) {
  for (auto& s : staging_)
    if (!s.in_use && s.mem.size() >= bytes) {
      s.in_use = true;
      return static_cast<uint8_t*>(s.mem.data());
    }
  // Pinned memory of the device's own provider copies fastest; any host memory will do.
  DeviceId id{near.provider->name, near.device};
  if (!(near.provider->dev->caps & HMC_DEV_CAP_PINNED_HOST)) id = {"cpu", 0};
  std::size_t size = 1;
  while (size < bytes) size <<= 1;
  auto mem = ctx_.alloc(id, size, AllocKind::kPinnedHost);
  if (!mem) return mem.status();
  // Keep a few buffers: beyond that, an idle one makes room.
  constexpr std::size_t kKeep = 8;
  if (staging_.size() >= kKeep) {
    auto idle = std::find_if(staging_.begin(), staging_.end(), [](const Staging& s) { return !s.in_use; });
    if (idle != staging_.end()) staging_.erase(idle);
  }
  staging_.push_back({std::move(mem.value()), true});
  return static_cast<uint8_t*>(staging_.back().mem.data());
}

void DeviceTransfers::release(uint8_t* buf) {
  for (auto& s : staging_)
    if (s.mem.data() == buf) s.in_use = false;
}

void DeviceTransfers::close() {
  for (auto& [key, imp] : imports_)
    if (imp.provider->dev->ipc_close(imp.provider->state, imp.ptr) != 0)
      HMC_LOG("core", warn, "closing imported {} memory of rank {} failed: {}", imp.provider->name, key.first,
              provider_error(*imp.provider));
  imports_.clear();
  exports_.clear();
  staging_.clear();
}

}  // namespace hmc::core
