#include "core/device_path.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "hmc/communicator.h"

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
  char device[32];
};

// The provider that copies between `a` and `b`: a vendor's own for its memory, cpu for
// host to host; null when two vendors' memories meet (they need host staging).
LoadedProvider* copier(LoadedProvider* a, LoadedProvider* b) {
  if (a->name == "cpu") return b;
  if (b->name == "cpu" || a == b) return a;
  return nullptr;
}

}  // namespace

std::string device_key(LoadedProvider& p, int device) {
  hmc_device_info_t info{};
  info.struct_size = sizeof(info);
  if (p.dev->device_info(p.state, device, &info) == 0 && info.pci_bus_id[0] != '\0') {
    std::string id(info.pci_bus_id, strnlen(info.pci_bus_id, sizeof(info.pci_bus_id)));
    std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
    return id;
  }
  return "index:" + std::to_string(device);
}

std::vector<uint8_t> encode_offer(const IpcOffer& offer) {
  OfferHead h{kOfferMagic, static_cast<uint32_t>(offer.handle.size()), offer.alloc_id, offer.alloc_bytes, offer.offset, {}, {}};
  std::strncpy(h.provider, offer.provider.c_str(), sizeof(h.provider) - 1);
  std::strncpy(h.device, offer.device.c_str(), sizeof(h.device) - 1);
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
      h.provider[sizeof(h.provider) - 1] != 0 || h.device[sizeof(h.device) - 1] != 0 || h.offset > h.alloc_bytes)
    return Status(ErrorCode::kInternal, "garbled IPC offer");
  return IpcOffer{h.provider, h.alloc_id, h.alloc_bytes, h.offset, h.device, std::vector<uint8_t>(data + sizeof(h), data + len)};
}

std::optional<IpcOffer> DeviceTransfers::offer(const void* ptr, std::size_t bytes) {
  ContextImpl::MemInfo m = ctx_.mem_info(ptr, bytes);
  if (!m.base || !(m.provider->dev->caps & HMC_DEV_CAP_IPC)) return std::nullopt;
  if (!m.device_mem && m.kind != AllocKind::kShareable) return std::nullopt;
  auto export_handle = [&]() -> std::optional<std::vector<uint8_t>> {
    std::vector<uint8_t> handle(HMC_IPC_HANDLE_MAX);
    std::size_t len = 0;
    auto* base = const_cast<uint8_t*>(m.base);
    if (m.provider->dev->ipc_export(m.provider->state, base, m.alloc_bytes, handle.data(), handle.size(), &len) != 0) {
      HMC_LOG("core", debug, "{} cannot export {} bytes for IPC ({}); staging instead", m.provider->name, m.alloc_bytes,
              provider_error(*m.provider));
      return std::nullopt;
    }
    handle.resize(len);
    return handle;
  };
  // Kept by HMC's allocation id, or for device memory HMC did not allocate by the id
  // mem_query gave it; without one it is exported afresh every time: HMC cannot see it
  // freed, and an allocation made again at its address is another one. A refusal is kept
  // too, as an empty handle: memory that cannot be exported (cudaMallocAsync's pools)
  // stays so, and is not offered again.
  std::optional<std::vector<uint8_t>> fresh;
  const std::vector<uint8_t>* handle = nullptr;
  auto& cache = m.alloc_id ? exports_ : foreign_exports_[m.provider];
  const uint64_t id = m.alloc_id ? m.alloc_id : m.foreign_id;
  if (cache.size() >= 4096) cache.clear();  // ids never repeat: dropping entries only costs re-exports
  if (auto it = id ? cache.find(id) : cache.end(); it != cache.end()) {
    if (it->second.empty()) return std::nullopt;
    handle = &it->second;
  } else if (!(fresh = export_handle())) {
    if (id) cache.emplace(id, std::vector<uint8_t>());
    return std::nullopt;
  } else if (id) {
    handle = &cache.emplace(id, std::move(*fresh)).first->second;
  } else {
    handle = &*fresh;
  }
  auto offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) - m.base);
  return IpcOffer{m.provider->name, m.alloc_id,   m.alloc_bytes,
                  offset,           m.device_mem ? device_key(*m.provider, m.device) : std::string(), *handle};
}

uint64_t offer_key(const IpcOffer& offer) {
  if (offer.alloc_id) return offer.alloc_id;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint8_t b : offer.handle) h = (h ^ b) * 1099511628211ull;
  return h | (1ull << 63);
}

DeviceTransfers::DeviceTransfers(ContextImpl& ctx)
    : ctx_(ctx), imports_(ctx.ipc_imports()), async_(ctx.config().flag("HMC_IPC_ASYNC")) {}

int DeviceTransfers::stream_device(const ContextImpl::MemInfo& from, const IpcOffer& offer, LoadedProvider* target,
                                   LoadedProvider* by) {
  if (!async_ || !from.device_mem || !(by->dev->caps & HMC_DEV_CAP_STREAMS)) return -1;
  if (target->name == "cpu") return from.device;  // into a peer's host memory: the source device copies
  // Between devices, on the destination's (where the synchronous copy runs too): queued on
  // the source device, a copy into memory imported on another one ran at a tenth of the
  // speed on 2x H200.
  int n = 0;
  if (offer.device.empty() || by->dev->device_count(by->state, &n) != 0) return -1;
  for (int d = 0; d < n; ++d)
    if (device_key(*by, d) == offer.device) return d;
  return -1;
}

void* DeviceTransfers::stream(LoadedProvider* by, int device) {
  if (!(by->dev->caps & HMC_DEV_CAP_STREAMS)) return nullptr;
  auto [it, added] = streams_.try_emplace({by, device}, nullptr);
  if (added && by->dev->stream_create(by->state, device, &it->second) != 0) {
    HMC_LOG("core", debug, "{} has no stream for IPC copies ({}); they run synchronously", by->name, provider_error(*by));
    it->second = nullptr;
  }
  return it->second;
}

Status DeviceTransfers::write(const PeerInfo& peer, const IpcOffer& offer, const void* src, std::size_t bytes,
                              Done done) {
  // The offer comes from the peer: bounded by what it says (decode_offer checked offset <=
  // alloc_bytes) and by the size the import was made with, without overflow.
  auto overruns = [&](uint64_t size) { return offer.offset > size || bytes > size - offer.offset; };
  const Status overrun{ErrorCode::kOutOfBounds, "IPC write of " + std::to_string(bytes) + " bytes at offset " +
                                                    std::to_string(offer.offset) + " overruns the offered memory"};
  if (overruns(offer.alloc_bytes)) return overrun;
  LoadedProvider* target = ctx_.registry().device(offer.provider);
  if (!target || !(target->dev->caps & HMC_DEV_CAP_IPC))
    return {ErrorCode::kUnsupported, "provider " + offer.provider + " is not loaded here with IPC"};
  const ContextImpl::MemInfo from = ctx_.mem_info(src, bytes);
  LoadedProvider* by = copier(target, from.provider);
  if (!by) return {ErrorCode::kUnsupported, "no provider copies from " + from.provider->name + " into " + offer.provider};
  auto exporter = exporters_.find(peer.rank);
  if (exporter == exporters_.end()) {
    exporter = exporters_.emplace(peer.rank, IpcImports::exporter(peer)).first;
    imports_.attach(exporter->second);
  }
  auto use = imports_.acquire(exporter->second, peer.rank, offer, target);
  if (!use) return use.status();
  if (overruns(use->bytes)) {
    imports_.release(use->id);
    return overrun;
  }
  imports_.pin(use->id, by, bytes);
  if (by != from.provider) ctx_.pin_for(by, src, bytes);
  // From device memory, the copy runs on a stream, ended by an event that poll() watches.
  return start(by, stream_device(from, offer, target, by), use->ptr + offer.offset, src, bytes, use->id,
               std::move(done));
}

Status DeviceTransfers::copy_async(LoadedProvider* by, int device, void* dst, const void* src, std::size_t bytes,
                                   Done done) {
  return start(by, device, dst, src, bytes, 0, std::move(done));
}

Status DeviceTransfers::start(LoadedProvider* by, int device, void* dst, const void* src, std::size_t bytes,
                              uint64_t import, Done done) {
  auto failed = [&](const char* how) {
    if (import) imports_.release(import);
    return Status{ErrorCode::kInternal, "copy of " + std::to_string(bytes) + " bytes" + how + " by " + by->name +
                                            " failed: " + provider_error(*by)};
  };
  void* st = device >= 0 ? stream(by, device) : nullptr;
  if (!st) {
    if (by->dev->copy(by->state, dst, src, bytes, nullptr) != 0) return failed("");
    if (import) imports_.release(import);
    done({});
    return {};
  }
  void* event = nullptr;
  auto idle = std::find_if(idle_events_.begin(), idle_events_.end(),
                           [&](const IdleEvent& e) { return e.by == by && e.device == device; });
  if (idle != idle_events_.end()) {
    event = idle->event;
    idle_events_.erase(idle);
  } else if (by->dev->event_create(by->state, device, &event) != 0) {
    return failed(" on a stream");
  }
  if (by->dev->copy(by->state, dst, src, bytes, st) != 0 || by->dev->event_record(by->state, event, st) != 0) {
    by->dev->event_destroy(by->state, event);
    return failed(" on a stream");
  }
  pending_.push_back({by, device, event, import, std::move(done)});
  return {};
}

bool DeviceTransfers::poll() {
  std::vector<std::pair<Done, Status>> finished;
  // Copies end in the order they were queued on their stream (one per provider and device),
  // and so do their callbacks: behind a copy seen running, a later one on the same stream
  // counts as running too. Each event is queried at its own moment, so the later one may
  // have ended by then; its callback first once let a staged send post its FIN ahead of an
  // earlier chunk (the receive ended without that chunk's bytes).
  auto& running = running_streams_;
  running.clear();
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::pair<LoadedProvider*, int> stream{it->by, it->device};
    const bool behind = std::find(running.begin(), running.end(), stream) != running.end();
    const int rc = behind ? 1 : it->by->dev->event_query(it->by->state, it->event);
    if (rc == 1) {
      if (!behind) running.push_back(stream);
      ++it;
      continue;
    }
    Status s = rc == 0 ? Status{} : Status{ErrorCode::kInternal, "stream copy by " + it->by->name + " failed: " + provider_error(*it->by)};
    if (it->import) imports_.release(it->import);
    idle_events_.push_back({it->by, it->device, it->event});
    finished.emplace_back(std::move(it->done), std::move(s));
    it = pending_.erase(it);
  }
  for (auto& [done, s] : finished) done(s);
  return !finished.empty();
}

Status DeviceTransfers::wait_one(Pending& p) {
  const auto until = ctx_.deadline();
  for (;;) {
    const int rc = p.by->dev->event_query(p.by->state, p.event);
    if (rc == 0) return {};
    if (rc != 1) return {ErrorCode::kInternal, "stream copy by " + p.by->name + " failed: " + provider_error(*p.by)};
    if (Clock::now() > until) return {ErrorCode::kTimeout, "a stream copy by " + p.by->name + " did not finish in time"};
    std::this_thread::yield();
  }
}

void DeviceTransfers::finish_all(const Status& why) {
  while (!pending_.empty()) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    Status s = wait_one(p);
    if (s.code() == ErrorCode::kTimeout) {
      // The copy may still write into the import: keep both, leak rather than unmap under it.
      HMC_LOG("core", err, "{}; its event and the peer memory it writes stay open", s.message());
      if (p.import) imports_.abandon(p.import);
    } else {
      if (p.import) imports_.release(p.import);
      idle_events_.push_back({p.by, p.device, p.event});
    }
    p.done(s.ok() ? why : s);
  }
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
  // Keep a few buffers: beyond that, an idle one makes room. Not while a stream waits on a
  // flag of this context: freeing pinned memory waits for the whole device
  // (cudaFreeHost), so it would not return before progress sets the flag, and progress
  // may be this thread, under the communicator's lock (as IpcImports::close_idle).
  constexpr std::size_t kKeep = 8;
  if (staging_.size() >= kKeep && !ctx_.engine()->held()) {
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
  finish_all({ErrorCode::kAborted, "the communicator closed while the IPC copy ran"});
  for (const auto& [rank, e] : exporters_) imports_.detach(e);
  exporters_.clear();
  for (auto& e : idle_events_) e.by->dev->event_destroy(e.by->state, e.event);
  idle_events_.clear();
  for (auto& [where, st] : streams_)
    if (st) where.first->dev->stream_destroy(where.first->state, st);
  streams_.clear();
  exports_.clear();
  staging_.clear();
}

}  // namespace hmc::core
