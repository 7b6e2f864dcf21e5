#include "common/request.h"

#include "common/host.h"

namespace hmc_net {

RequestTable::~RequestTable() {
  for (Request* r : live_) delete r;
}

Request* RequestTable::create() {
  auto* r = new Request;
  std::lock_guard lock(mu_);
  live_.insert(r);
  return r;
}

void RequestTable::discard(Request* req) {
  {
    std::lock_guard lock(mu_);
    live_.erase(req);
  }
  delete req;
}

int RequestTable::test(void* handle, int* done, size_t* bytes, char* message, size_t message_cap) {
  auto* req = static_cast<Request*>(handle);
  {
    std::lock_guard lock(mu_);
    if (done != nullptr) *done = 0;
    if (!live_.contains(req)) {
      copy_text("unknown request (already released?)", message, message_cap);
      return HMC_PROV_ERR_INVALID;
    }
    if (req->state.load(std::memory_order_acquire) == HMC_PROV_IN_PROGRESS) return HMC_PROV_OK;
    live_.erase(req);
  }
  int state = req->state.load(std::memory_order_acquire);
  if (state == HMC_PROV_OK) {
    if (done != nullptr) *done = 1;
    if (bytes != nullptr) *bytes = req->bytes;
  } else {
    copy_text(req->message, message, message_cap);
  }
  delete req;
  return state;
}

}  // namespace hmc_net
