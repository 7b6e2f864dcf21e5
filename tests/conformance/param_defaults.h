// The kits' host services read parameters as libhmc's do: one the user did not set reads
// as its default from the provider's table (core/plugin_registry.cpp, host_config_get).
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "hmc/provider/common.h"

namespace hmc::conformance {

inline void add_param_defaults(std::map<std::string, std::string>& config, const hmc_param_t* params, std::size_t n) {
  for (std::size_t i = 0; params != nullptr && i < n; ++i)
    if (params[i].name != nullptr && params[i].default_value != nullptr && params[i].default_value[0] != '\0')
      config.emplace(params[i].name, params[i].default_value);  // a value set stays
}

}  // namespace hmc::conformance
