#include "common/request.h"

#include <cstdint>
#include <new>

#include "common/host.h"

namespace hmc_net {

RequestTable::~RequestTable() {
  for (size_t i = 0; i < chunk_count_.load(); ++i) delete[] chunks_[i].load();
}

Request* RequestTable::create() {
  std::lock_guard lock(mu_);
  Request* r = nullptr;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
    r->bytes = 0;
    r->message.clear();
  } else {
    size_t n = chunk_count_.load(std::memory_order_relaxed);
    if (n == 0 || slots_used_ == kFirstChunk << (n - 1)) {
      if (n == kMaxChunks) throw std::bad_alloc();  // as `new` would first; guarded() reports it
      auto* chunk = new Request[kFirstChunk << n];
      for (size_t k = 0; k < (kFirstChunk << n); ++k) {
        chunk[k].state.store(Request::kNotLive, std::memory_order_relaxed);
        chunk[k].ends = &ends_;
      }
      chunks_[n].store(chunk, std::memory_order_release);
      chunk_count_.store(++n, std::memory_order_release);
      slots_used_ = 0;
    }
    r = chunks_[n - 1].load(std::memory_order_relaxed) + slots_used_++;
  }
  r->state.store(HMC_PROV_IN_PROGRESS, std::memory_order_relaxed);
  r->live = true;
  return r;
}

Request* RequestTable::slot_of(void* handle) const {
  const auto at = reinterpret_cast<uintptr_t>(handle);
  const size_t n = chunk_count_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    const auto base = reinterpret_cast<uintptr_t>(chunks_[i].load(std::memory_order_acquire));
    if (at >= base && at < base + (kFirstChunk << i) * sizeof(Request))
      return (at - base) % sizeof(Request) == 0 ? static_cast<Request*>(handle) : nullptr;
  }
  return nullptr;
}

void RequestTable::release_locked(Request* req) {
  req->live = false;
  req->state.store(Request::kNotLive, std::memory_order_relaxed);
  free_.push_back(req);
}

void RequestTable::discard(Request* req) {
  std::lock_guard lock(mu_);
  if (Request* r = slot_of(req); r != nullptr && r->live) release_locked(r);
}

int RequestTable::test(void* handle, int* done, size_t* bytes, char* message, size_t message_cap) {
  if (done != nullptr) *done = 0;
  // Pending, the usual answer to a poll: no lock (see request.h).
  Request* slot = slot_of(handle);
  if (slot != nullptr && slot->state.load(std::memory_order_acquire) == HMC_PROV_IN_PROGRESS) return HMC_PROV_OK;
  std::lock_guard lock(mu_);
  if (slot == nullptr || !slot->live) {
    copy_text("unknown request (already released?)", message, message_cap);
    return HMC_PROV_ERR_INVALID;
  }
  const int state = slot->state.load(std::memory_order_acquire);
  if (state == HMC_PROV_IN_PROGRESS) return HMC_PROV_OK;
  if (state == HMC_PROV_OK) {
    if (done != nullptr) *done = 1;
    if (bytes != nullptr) *bytes = slot->bytes;
  } else {
    copy_text(slot->message, message, message_cap);
  }
  release_locked(slot);
  return state;
}

}  // namespace hmc_net
