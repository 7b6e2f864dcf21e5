// Requests: small heap objects with an atomic state, completed on the io thread
// and polled by `test` from any thread.
//
// The io thread writes `bytes`/`message` before publishing the state with a
// release store; `test` reads the state with acquire, so whatever it reports is
// complete. A request belongs to the table from creation until `test` reports it
// done or failed (then it is released) or until the provider is finalized.
// Released requests are kept and handed out again, so a message costs no heap
// allocation once the table has as many as are in flight at once; the table owns
// every request it ever made and frees them when it goes.
//
// Requests live in chunks that only grow (chunk i holds kFirstChunk << i), so any
// thread can tell without the lock whether a handle is one of the table's slots:
// `test` of a request still pending (the usual answer to a poll) takes no lock. A
// slot not handed out holds kNotLive, never "pending", so a released or never-made
// handle still goes the locked way and is refused there.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "hmc/provider/common.h"

namespace hmc_net {

struct Request {
  static constexpr int kNotLive = 2;  // the state of a slot not handed out
  std::atomic<int> state{HMC_PROV_IN_PROGRESS};  // 1 pending, 0 done, negative failed
  size_t bytes = 0;
  std::string message;
  bool live = false;  // handed out and not yet released (RequestTable::mu_)

  // The table's count of ends (the ABI's `events`), moved after the state.
  std::atomic<uint64_t>* ends = nullptr;

  void complete(size_t n) {
    bytes = n;
    state.store(HMC_PROV_OK, std::memory_order_release);
    ended();
  }
  void fail(int code, std::string why) {
    message = std::move(why);
    state.store(code, std::memory_order_release);
    ended();
  }

 private:
  void ended() {
    if (ends != nullptr) ends->fetch_add(1, std::memory_order_release);
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
  // The ABI's events: how many requests have ended (see net.h).
  uint64_t ends() const { return ends_.load(std::memory_order_acquire); }

 private:
  static constexpr size_t kFirstChunk = 64;
  static constexpr size_t kMaxChunks = 32;  // 64 << 31 requests in the last: more than memory holds
  // The table's slot at this handle (live or not), or null; no lock needed.
  Request* slot_of(void* handle) const;
  void release_locked(Request* req);

  std::mutex mu_;
  std::array<std::atomic<Request*>, kMaxChunks> chunks_{};  // chunk i: kFirstChunk << i slots
  std::atomic<size_t> chunk_count_{0};
  std::atomic<uint64_t> ends_{0};
  size_t slots_used_ = 0;       // slots of the last chunk handed out at least once (mu_)
  std::vector<Request*> free_;  // released, to hand out again (mu_)
};

}  // namespace hmc_net
