#include "collectives/scratch.h"

#include <algorithm>
#include <bit>
#include <mutex>
#include <new>

#include "core/context_impl.h"
#include "core/log.h"
#include "core/plugin_registry.h"
#include "core/stream_order.h"

namespace hmc::coll {
namespace {

constexpr std::align_val_t kAlign{64};
constexpr std::size_t kMinBlock = 64 * 1024;

// The smallest entry of `list` that `fits`, by `size`, or end().
template <class List, class Fits, class Size>
auto best_fit(List& list, Fits fits, Size size) {
  auto best = list.end();
  for (auto it = list.begin(); it != list.end(); ++it)
    if (fits(*it) && (best == list.end() || size(*it) < size(*best))) best = it;
  return best;
}

// Blocks are rounded up to powers of two: past this size the rounding would not fit.
constexpr std::size_t kMaxBlock = std::size_t{1} << (sizeof(std::size_t) * 8 - 1);

Status too_large(std::size_t bytes) {
  return {ErrorCode::kNoMemory, "collective scratch of " + std::to_string(bytes) + " bytes does not fit in memory"};
}

}  // namespace

void Scratch::HeapFree::operator()(uint8_t* p) const { ::operator delete(p, kAlign); }

Result<Memory> ScratchPool::take(core::ContextImpl& ctx, const DeviceId& device, std::size_t bytes) {
  if (bytes > kMaxBlock) return too_large(bytes);
  {
    std::lock_guard lock(mu_);
    // The smallest free block of this device that fits.
    auto best = best_fit(free_, [&](const Memory& m) { return m.device() == device && m.size() >= bytes; },
                         [](const Memory& m) { return m.size(); });
    if (best != free_.end()) {
      Memory m = std::move(*best);
      free_.erase(best);
      return m;
    }
  }
  return ctx.alloc(device, std::bit_ceil(std::max<std::size_t>(bytes, kMinBlock)), AllocKind::kDefault);
}

void ScratchPool::give(Memory block) {
  std::lock_guard lock(mu_);
  free_.push_back(std::move(block));
}

uint8_t* ScratchPool::take_host(std::size_t bytes, std::size_t& size) {
  std::lock_guard lock(mu_);
  auto by_size = [](const auto& h) { return h.second; };
  auto best = best_fit(host_, [&](const auto& h) { return h.second >= bytes; }, by_size);
  if (best == host_.end()) return nullptr;
  uint8_t* block = best->first;
  size = best->second;
  host_.erase(best);
  return block;
}

void ScratchPool::give_host(uint8_t* block, std::size_t size) {
  {
    std::lock_guard lock(mu_);
    if (host_.size() < kHostKept) {
      host_.emplace_back(block, size);
      return;
    }
  }
  Scratch::HeapFree{}(block);
}

Result<uint8_t*> ScratchPool::take_staging(core::LoadedProvider* p, std::size_t bytes, std::size_t limit,
                                           std::size_t& size) {
  if (bytes > kMaxBlock) return too_large(bytes);
  // Sizes in eighths of a power of two: at most 12.5 % unused, and few distinct sizes.
  const std::size_t want = std::max<std::size_t>(bytes, kMinBlock), step = std::bit_ceil(want) / 8;
  size = (want + step - 1) / step * step;
  std::vector<Staging> evicted;
  {
    std::lock_guard lock(mu_);
    auto best = best_fit(staging_, [&](const Staging& s) { return s.p == p && s.size >= bytes; },
                         [](const Staging& s) { return s.size; });
    if (best != staging_.end()) {
      uint8_t* block = best->block;
      size = best->size;
      staging_.erase(best);
      ++staging_taken_;
      return block;
    }
    if (staging_bytes_ + size > limit) {
      if (staging_taken_ > 0) return nullptr;
      // None taken, so no stream-ordered call of this communicator is in flight: kept blocks,
      // none of which fits, go, the largest first, until this one fits (one call may exceed).
      while (!staging_.empty() && staging_bytes_ + size > limit) {
        auto largest = std::max_element(staging_.begin(), staging_.end(),
                                        [](const Staging& a, const Staging& b) { return a.size < b.size; });
        staging_bytes_ -= largest->size;
        evicted.push_back(*largest);
        staging_.erase(largest);
      }
    }
    staging_bytes_ += size;  // claimed before the (slow) registration, released on failure
    ++staging_taken_;
  }
  for (const Staging& e : evicted) release_staging(e);
  auto unclaim = [&] {
    std::lock_guard lock(mu_);
    staging_bytes_ -= size;
    --staging_taken_;
  };
  auto* block = static_cast<uint8_t*>(::operator new(size, kAlign, std::nothrow));
  if (!block) {
    unclaim();
    return Status(ErrorCode::kNoMemory, "host staging of " + std::to_string(size) + " bytes");
  }
  if (p->dev->host_register(p->state, block, size) != 0) {
    Scratch::HeapFree{}(block);
    unclaim();
    return Status(ErrorCode::kUnsupported, p->name + " could not register " + std::to_string(size) +
                                               " bytes of host staging: " + core::provider_error(*p));
  }
  return block;
}

void ScratchPool::give_staging(core::LoadedProvider* p, uint8_t* block, std::size_t size) {
  std::lock_guard lock(mu_);
  staging_.push_back({p, block, size});
  --staging_taken_;
}

void ScratchPool::release_staging(const Staging& st) {
  if (st.p->dev->host_unregister(st.p->state, st.block) != 0) {
    // Freeing memory the device may still count as registered is worse than leaking it.
    HMC_LOG("coll", warn, "{} could not unregister {} bytes of host staging ({}): the block is leaked",
            st.p->name, st.size, core::provider_error(*st.p));
    return;
  }
  Scratch::HeapFree{}(st.block);
}

ScratchPool::~ScratchPool() {
  for (auto& [block, size] : host_) Scratch::HeapFree{}(block);
  for (auto& st : staging_) release_staging(st);
}

Scratch::~Scratch() {
  if (!pool_) return;
  for (auto& m : device_mem_) pool_->give(std::move(m));
  for (auto& [block, size] : heap_)
    if (size >= ScratchPool::kHostKeepMin) pool_->give_host(block.release(), size);
}

Result<uint8_t*> Scratch::get(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > kMaxBlock) return too_large(bytes);
  if (device_.provider == "cpu") {
    // Host scratch comes from the heap, not from the cpu provider: the provider maps every
    // block afresh (and unmaps it on free), so each collective would fault its scratch in
    // again, while the heap hands back pages already touched. Plain host memory is device
    // cpu:0 to core (ContextImpl::provider_of), so reduce and copy treat it the same.
    std::size_t size = bytes;
    uint8_t* p = nullptr;
    if (bytes >= ScratchPool::kHostKeepMin) {
      size = std::bit_ceil(bytes);
      if (pool_) p = pool_->take_host(bytes, size);
    }
    if (!p) p = static_cast<uint8_t*>(::operator new(size, kAlign, std::nothrow));
    if (!p) return Status(ErrorCode::kNoMemory, "collective scratch of " + std::to_string(bytes) + " bytes");
    heap_.emplace_back(p, size);
    return p;
  }
  auto mem = pool_ ? pool_->take(ctx_, device_, bytes) : ctx_.alloc(device_, bytes, AllocKind::kDefault);
  if (!mem) return mem.status();
  auto* p = static_cast<uint8_t*>(mem->data());
  device_mem_.push_back(std::move(mem.value()));
  return p;
}

void Scratch::leak() {
  for (auto& h : heap_) (void)h.first.release();
  heap_.clear();
  for (auto& h : held_) core::leak_forever(std::move(h));
  held_.clear();
  // Never destroyed: Memory's destructor would free. The provider releases it at fini.
  static auto* graveyard = new std::vector<Memory>();
  static std::mutex mu;
  std::lock_guard lock(mu);
  for (auto& m : device_mem_) graveyard->push_back(std::move(m));
  device_mem_.clear();
}

}  // namespace hmc::coll
