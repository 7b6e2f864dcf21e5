// Request: the handle of a non-blocking operation.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "hmc/status.h"

namespace hmc {

class Request;
namespace core {
class Operation;
// The library's own view of a request's state (core/api_context.cpp).
const std::shared_ptr<Operation>& op_of(const Request& r);
}

using Clock = std::chrono::steady_clock;

// A default-constructed Request is no operation: wait() fails with
// kInvalidArgument, test() returns true, status() is Ok and bytes() 0.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<core::Operation> op) : op_(std::move(op)) {}

  // Blocks until the operation ends or `timeout` passes (kTimeout; the
  // operation stays pending and keeps using its buffers until it ends). The
  // default is HMC_TIMEOUT; a timeout too long for the clock
  // (milliseconds::max()) waits without end. A collective that failed (other
  // than refused at the call) may still have transfers of its buffers under way
  // with the ranks that are left: its buffers are HMC's until the communicator
  // is aborted or finalized (both return once nothing touches them).
  Status wait();
  Status wait(std::chrono::milliseconds timeout);
  // true when finished (successfully or not), false while pending.
  bool test();
  // The outcome once finished (a wait's own kTimeout is not stored here; an
  // operation may still end in kTimeout, e.g. a delegated collective past
  // HMC_TIMEOUT). Ok while pending.
  Status status() const;
  // Bytes moved (for a receive: the size of the message received); read it once
  // test() returned true or wait() returned.
  std::size_t bytes() const;
  bool valid() const { return op_ != nullptr; }

 private:
  friend const std::shared_ptr<core::Operation>& core::op_of(const Request& r);
  std::shared_ptr<core::Operation> op_;
};

// Waits for all, returns the first failure (all are waited for anyway). The deadline
// counts from the call: each request's HMC_TIMEOUT, or `timeout` for all; once it has
// passed, the requests left are looked at once and kTimeout stands for any unfinished.
Status wait_all(Request* requests, std::size_t n);
Status wait_all(Request* requests, std::size_t n, std::chrono::milliseconds timeout);

}  // namespace hmc
