#include "hmc/status.h"

#include <cstdio>
#include <cstdlib>

namespace hmc {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kNoMemory: return "out of memory";
    case ErrorCode::kPeerLost: return "peer lost";
    case ErrorCode::kRefused: return "refused";
    case ErrorCode::kOutOfBounds: return "out of bounds";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kFinalized: return "finalized";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

void value_of_failed_result(const Status& status) {
  std::fprintf(stderr, "hmc: Result::value() called on an error: %s\n", status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace hmc
