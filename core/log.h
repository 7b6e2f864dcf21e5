// Logging: one spdlog logger per subsystem ("core", "path", "coll", "boot", "prov.<name>").
// The level comes from HMC_LOG_LEVEL (trace, debug, info, warn, error, off; default warn).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace hmc::core {

// The logger of a subsystem, created on first use with the configured level.
std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);
// Applies a level to every logger, present and future. Unknown names are an error (false).
bool set_log_level(const std::string& level);

}  // namespace hmc::core

// `sub` must be a constant: the logger is looked up once per call site.
#define HMC_LOG(sub, lvl, ...)                                                    \
  do {                                                                            \
    static const auto hmc_logger_ = ::hmc::core::logger(sub);                     \
    if (hmc_logger_->should_log(spdlog::level::lvl)) hmc_logger_->log(spdlog::level::lvl, __VA_ARGS__); \
  } while (0)
