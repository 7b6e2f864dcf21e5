// The kits' host services read parameters as libhmc's do: from the environment as libhmc
// reads it, and one the user did not set as its default from the provider's table
// (core/plugin_registry.cpp, host_config_get).
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "hmc/provider/common.h"

extern char** environ;

namespace hmc::conformance {

// The settings libhmc would read from the environment: every HMC_* variable but the kit's
// own HMC_CONFORMANCE_* and the empty ones (unset for libhmc: core/config.cpp).
inline std::map<std::string, std::string> environment_settings() {
  std::map<std::string, std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos || eq + 1 == entry.size() || entry.rfind("HMC_", 0) != 0 ||
        entry.rfind("HMC_CONFORMANCE_", 0) == 0)
      continue;
    out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
}

inline void add_param_defaults(std::map<std::string, std::string>& config, const hmc_param_t* params, std::size_t n) {
  for (std::size_t i = 0; params != nullptr && i < n; ++i)
    if (params[i].name != nullptr && params[i].default_value != nullptr && params[i].default_value[0] != '\0')
      config.emplace(params[i].name, params[i].default_value);  // a value set stays
}

}  // namespace hmc::conformance
