#include "core/ipc_imports.h"

#include "core/context_impl.h"
#include "core/device_path.h"
#include "core/log.h"
#include "hmc/communicator.h"

namespace hmc::core {

IpcImports::~IpcImports() {
  for (auto& [id, imp] : imports_) close(imp);
}

std::string IpcImports::exporter(const PeerInfo& peer) { return peer.host + "/" + std::to_string(peer.pid); }

IpcImports::Imports::iterator IpcImports::find(const std::string& exporter, uint64_t key) {
  for (auto it = imports_.begin(); it != imports_.end(); ++it)
    if (it->second.key == key && it->second.exporter == exporter) return it;
  return imports_.end();
}

void IpcImports::close(Import& imp) {
  if (imp.pinned_by && imp.pinned_by->dev->host_unregister(imp.pinned_by->state, imp.ptr) != 0)
    HMC_LOG("core", warn, "{} could not unregister the host memory of {} it imported: {}", imp.pinned_by->name,
            imp.exporter, provider_error(*imp.pinned_by));
  imp.pinned_by = nullptr;
  if (imp.provider->dev->ipc_close(imp.provider->state, imp.ptr) != 0)
    HMC_LOG("core", warn, "closing imported {} memory of {} failed: {}", imp.provider->name, imp.exporter,
            provider_error(*imp.provider));
}

template <class Pick>
bool IpcImports::close_idle(Pick pick) {
  // Closing an import waits for the whole device (cudaIpcCloseMemHandle), and so would not
  // return while a stream waits on a flag of this context, which only progress sets (this
  // thread's, perhaps): then imports stay open until no flag is pending. Not covered: a
  // stream-ordered call that another thread makes between the check and the close.
  if (ctx_.engine()->held()) return false;
  bool closed = false;
  for (auto it = imports_.begin(); it != imports_.end();) {
    if (it->second.uses != 0 || !pick(it->second)) {
      ++it;
      continue;
    }
    close(it->second);
    it = imports_.erase(it);
    closed = true;
  }
  return closed;
}

void IpcImports::close_orphans() {
  if (!orphans_ || ctx_.engine()->held()) return;  // close_idle would close nothing
  close_idle([&](const Import& imp) { return !attached_.count(imp.exporter); });
  orphans_ = false;
  for (const auto& [id, imp] : imports_) orphans_ |= !attached_.count(imp.exporter);
}

Result<IpcImports::Use> IpcImports::acquire(const std::string& exporter, int rank, const IpcOffer& offer,
                                            LoadedProvider* target) {
  auto who = [rank] { return "rank " + std::to_string(rank); };
  std::lock_guard lock(mu_);
  close_orphans();
  const uint64_t key = offer_key(offer);
  auto it = find(exporter, key);
  if (it != imports_.end() && (it->second.handle != offer.handle || it->second.provider != target)) {
    // Another allocation under the same key: the old import goes once no copy holds it
    // (and closing it cannot wait on a flag: close_idle).
    const Import* stale = &it->second;
    if (!close_idle([stale](const Import& imp) { return &imp == stale; }))
      return Status(ErrorCode::kUnsupported, "two IPC handles of " + who() + " share an import key");
    it = imports_.end();
  }
  if (it == imports_.end()) {
    while (imports_.size() >= kMaxImports) {
      const Import* oldest = nullptr;
      for (const auto& [id, imp] : imports_)
        if (imp.uses == 0 && (!oldest || imp.last_use < oldest->last_use)) oldest = &imp;
      if (!oldest || !close_idle([oldest](const Import& imp) { return &imp == oldest; })) break;
    }
    void* ptr = nullptr;
    auto import_it = [&] {
      return target->dev->ipc_import(target->state, offer.handle.data(), offer.handle.size(), &ptr) == 0 && ptr;
    };
    // A driver refuses memory this process maps already through an import of an allocation
    // the peer has freed since (CUDA, cudaErrorAlreadyMapped). Closing this exporter's idle
    // imports, whichever communicator made them, lets such an import through; they are made
    // again when used.
    if (!import_it()) {
      const bool closed = close_idle([&](const Import& imp) { return imp.exporter == exporter; });
      if (closed) HMC_LOG("core", debug, "closed the idle imports of {} to import another allocation of it", who());
      if (!closed || !import_it())
        return Status(ErrorCode::kUnsupported,
                      "importing " + who() + "'s " + offer.provider + " memory failed: " + provider_error(*target));
    }
    // Writes stay within what the offer says and what the import maps: the offer comes
    // from the peer, the extent from the provider's own mapping (where it can say).
    uint64_t bytes = offer.alloc_bytes;
    if (target->dev->caps & HMC_DEV_CAP_IPC_EXTENT) {
      std::size_t mapped = 0;
      if (target->dev->ipc_extent(target->state, ptr, &mapped) != 0) {
        const Status why(ErrorCode::kUnsupported, "the size of " + who() + "'s imported " + offer.provider +
                                                     " memory is unknown: " + provider_error(*target));
        target->dev->ipc_close(target->state, ptr);
        return why;
      }
      bytes = std::min<uint64_t>(bytes, mapped);
    }
    const uint64_t id = next_id_++;
    it = imports_.emplace(id, Import{exporter, key, id, target, ptr, bytes, 0, 0, nullptr, offer.handle}).first;
  }
  Import& imp = it->second;
  imp.last_use = ++uses_;
  ++imp.uses;
  return Use{imp.id, static_cast<uint8_t*>(imp.ptr), imp.bytes};
}

void IpcImports::pin(uint64_t id, LoadedProvider* by, std::size_t bytes) {
  std::lock_guard lock(mu_);
  auto it = imports_.find(id);
  if (it == imports_.end()) return;
  Import& imp = it->second;
  const std::size_t min = ctx_.host_register_min();
  if (imp.pinned_by || imp.provider->name != "cpu" || by == imp.provider || !(by->dev->caps & HMC_DEV_CAP_HOST_REGISTER) ||
      min == 0 || bytes < min)
    return;
  if (by->dev->host_register(by->state, imp.ptr, imp.bytes) != 0) {
    HMC_LOG("core", debug, "{} did not register {} bytes of a peer's host memory ({}); copies into it run at pageable speed",
            by->name, imp.bytes, provider_error(*by));
    return;
  }
  imp.pinned_by = by;
}

void IpcImports::release(uint64_t id) {
  std::lock_guard lock(mu_);
  if (auto it = imports_.find(id); it != imports_.end() && it->second.uses > 0) --it->second.uses;
}

void IpcImports::abandon(uint64_t id) {
  std::lock_guard lock(mu_);
  imports_.erase(id);
}

void IpcImports::attach(const std::string& exporter) {
  std::lock_guard lock(mu_);
  ++attached_[exporter];
}

void IpcImports::detach(const std::string& exporter) {
  std::lock_guard lock(mu_);
  auto it = attached_.find(exporter);
  if (it == attached_.end() || --it->second > 0) return;
  attached_.erase(it);
  orphans_ = true;
  close_orphans();
}

std::size_t IpcImports::open_imports() {
  std::lock_guard lock(mu_);
  return imports_.size();
}

}  // namespace hmc::core
