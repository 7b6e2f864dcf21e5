#include "common/request.h"

#include <algorithm>
#include <functional>

#include "common/host.h"

namespace hmc_net {

RequestTable::~RequestTable() {
  for (Request* r : owned_) delete r;
}

Request* RequestTable::create() {
  std::lock_guard lock(mu_);
  Request* r = nullptr;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
    r->state.store(HMC_PROV_IN_PROGRESS, std::memory_order_relaxed);
    r->bytes = 0;
    r->message.clear();
  } else {
    r = new Request;
    owned_.insert(std::upper_bound(owned_.begin(), owned_.end(), r, std::less<>{}), r);
  }
  r->live = true;
  return r;
}

Request* RequestTable::find_locked(void* handle) const {
  auto* req = static_cast<Request*>(handle);
  auto it = std::lower_bound(owned_.begin(), owned_.end(), req, std::less<>{});
  return it != owned_.end() && *it == req ? req : nullptr;
}

void RequestTable::release_locked(Request* req) {
  req->live = false;
  free_.push_back(req);
}

void RequestTable::discard(Request* req) {
  std::lock_guard lock(mu_);
  if (Request* r = find_locked(req); r != nullptr && r->live) release_locked(r);
}

int RequestTable::test(void* handle, int* done, size_t* bytes, char* message, size_t message_cap) {
  std::lock_guard lock(mu_);
  if (done != nullptr) *done = 0;
  Request* req = find_locked(handle);
  if (req == nullptr || !req->live) {
    copy_text("unknown request (already released?)", message, message_cap);
    return HMC_PROV_ERR_INVALID;
  }
  const int state = req->state.load(std::memory_order_acquire);
  if (state == HMC_PROV_IN_PROGRESS) return HMC_PROV_OK;
  if (state == HMC_PROV_OK) {
    if (done != nullptr) *done = 1;
    if (bytes != nullptr) *bytes = req->bytes;
  } else {
    copy_text(req->message, message, message_cap);
  }
  release_locked(req);
  return state;
}

}  // namespace hmc_net
