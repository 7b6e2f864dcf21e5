// Status and Result<T>: how every HMC call reports success or a clear error.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace hmc {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // null buffer, bad rank, bad size, malformed setting
  kUnsupported,      // the provider or path lacks the capability
  kUnavailable,      // runtime, driver, device or provider missing
  kNoMemory,
  kPeerLost,         // a peer closed, crashed or stopped answering
  kRefused,          // connection refused or not authenticated
  kOutOfBounds,      // write past the end of a registered region
  kMismatch,         // send/recv size mismatch, arguments differ across ranks
  kTimeout,          // a deadline passed
  kFinalized,        // used after finalize()
  kAborted,          // abort() was called
  kNotFound,
  kInternal,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "peer lost: rank 1 closed the connection" style text for logs and users.
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// What value() of a failed Result does: it is a programming error (test ok() first), and
// the library throws no exceptions, so it prints the error it holds to stderr
// ("hmc: Result::value() called on an error: unavailable: ...") and aborts.
[[noreturn]] void value_of_failed_result(const Status& status);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}              // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}       // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return *checked(*this); }
  const T& value() const& { return *checked(*this); }
  T&& value() && { return std::move(*checked(*this)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  template <class Self>
  static auto* checked(Self& self) {
    if (auto* v = std::get_if<T>(&self.v_)) return v;
    value_of_failed_result(*std::get_if<Status>(&self.v_));
  }
  std::variant<T, Status> v_;
};

#define HMC_RETURN_IF_ERROR(expr)        \
  do {                                   \
    ::hmc::Status hmc_status_ = (expr);  \
    if (!hmc_status_.ok()) return hmc_status_; \
  } while (0)

}  // namespace hmc
