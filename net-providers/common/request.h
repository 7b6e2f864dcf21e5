// Requests: small heap objects with an atomic state, completed on the io thread
// and polled by `test` from any thread.
//
// The io thread writes `bytes`/`message` before publishing the state with a
// release store; `test` reads the state with acquire, so whatever it reports is
// complete. A request belongs to the table from creation until `test` reports it
// done or failed (then it is freed) or until the provider is finalized.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_set>

#include "hmc/provider/common.h"

namespace hmc_net {

struct Request {
  std::atomic<int> state{HMC_PROV_IN_PROGRESS};  // 1 pending, 0 done, negative failed
  size_t bytes = 0;
  std::string message;

  void complete(size_t n) {
    bytes = n;
    state.store(HMC_PROV_OK, std::memory_order_release);
  }
  void fail(int code, std::string why) {
    message = std::move(why);
    state.store(code, std::memory_order_release);
  }
};

class RequestTable {
 public:
  RequestTable() = default;
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;
  ~RequestTable();

  Request* create();
  // Forgets a request that was never handed out (its operation was refused).
  void discard(Request* req);
  // The ABI's test: see net.h. Unknown requests give HMC_PROV_ERR_INVALID.
  int test(void* req, int* done, size_t* bytes, char* message, size_t message_cap);

 private:
  std::mutex mu_;
  std::unordered_set<Request*> live_;
};

}  // namespace hmc_net
