// The rules libhmc's loader applies to a provider's parameter table (core/config.cpp,
// Config::bad_params), checked by both kits, so that a plugin that passes a kit is not
// then refused by libhmc. Names a core setting takes inside a provider's prefix (core's
// HMC_SHM_COLL in shm's) are libhmc's to know; the kits do not.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <string>

#include "hmc/provider/common.h"
#include "hmc/provider/param_text.h"

namespace hmc::conformance {

inline void check_params(const char* provider, const hmc_param_t* params, std::size_t n) {
  CHECK((n == 0 || params != nullptr));
  const std::string prefix = hmc_text::param_prefix(provider);
  const std::set<std::string> types = {"size", "int", "bool", "duration", "list", "string"};
  std::set<std::string> names;
  for (std::size_t i = 0; params != nullptr && i < n; ++i) {
    const hmc_param_t& q = params[i];
    REQUIRE(q.name != nullptr);
    const std::string name = q.name;
    INFO("parameter " << name);
    // HMC_<NAME>_* and more: names of two providers cannot clash.
    CHECK(name.rfind(prefix, 0) == 0);
    CHECK(name.size() > prefix.size());
    CHECK(names.insert(name).second);
    REQUIRE(q.type != nullptr);
    CHECK(types.contains(q.type));
    REQUIRE(q.default_value != nullptr);
    // The provider reads its default through config_get as if set: it must parse too.
    INFO("default '" << q.default_value << "' of type " << q.type);
    CHECK((q.default_value[0] == '\0' || hmc_text::valid(q.type, q.default_value)));
    CHECK((q.help != nullptr && q.help[0] != '\0'));
  }
}

}  // namespace hmc::conformance
