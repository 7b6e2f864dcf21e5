// UniqueId: the bootstrap root's address and the job secret, passed to every rank.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "hmc/status.h"

namespace hmc {

struct UniqueId {
  std::string root;                    // "host:port" of the bootstrap root
  std::array<uint8_t, 16> secret{};    // random job secret; authenticates every connection

  // "hmc1:<host>:<port>:<32 hex digits>", safe for environment variables and command lines.
  std::string to_string() const;
  static Result<UniqueId> parse(const std::string& text);
};

}  // namespace hmc
