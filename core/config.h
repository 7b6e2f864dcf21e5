// Config: the one table of every HMC_* setting, parsed once per Context.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hmc/context.h"
#include "hmc/provider/common.h"
#include "hmc/status.h"

namespace hmc::core {

enum class ParamType { kString, kInt, kSize, kBool, kDuration, kList, kForeign };

struct ParamDef {
  std::string name;
  ParamType type;
  std::string default_value;
  std::string help;
  std::string owner = "core";  // "core" or the provider that registered it
  std::vector<std::string> choices = {};  // a string's allowed values; empty: any
};

class Config {
 public:
  // Reads the environment once, applies `overrides` (names must be known) and validates
  // the core table. Provider tables come later through add_params().
  static Result<Config> load(const std::map<std::string, std::string>& overrides);

  // Registers a provider's parameters and validates any value already set for them.
  Status add_params(const std::string& owner, const hmc_param_t* params, std::size_t n);
  // What is wrong with provider `owner`'s parameter table ("" when nothing): a fault of
  // the provider, which the loader refuses alone, unlike a malformed value the user set.
  // Its names are HMC_<OWNER>_*, and none is core's or another provider's already.
  std::string bad_params(const std::string& owner, const hmc_param_t* params, std::size_t n) const;

  // The value as text (set or default); nullopt for an unknown name.
  std::optional<std::string> text(const std::string& name) const;
  // Whether the user set it (environment or option).
  bool is_set(const std::string& name) const;
  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  uint64_t size(const std::string& name) const;
  bool flag(const std::string& name) const;
  std::chrono::microseconds duration(const std::string& name) const;

  std::vector<ConfigEntry> entries() const;
  // HMC_* names set in the environment or options that no table claims (typos, usually),
  // each with where it was set ("env" or "option").
  std::vector<std::pair<std::string, std::string>> unclaimed() const;

  static const std::vector<ParamDef>& core_params();

 private:
  std::map<std::string, ParamDef> defs_;
  std::map<std::string, std::pair<std::string, std::string>> values_;  // name -> (value, source)
};

// "HMC_<PROVIDER>_": what each of a provider's parameters must be named.
std::string param_prefix(const std::string& provider);

// Parsers shared with tools: "64K", "4MiB", "1G" -> bytes; "30s", "500ms", "2m", "10" (s).
std::optional<uint64_t> parse_size(const std::string& text);
// At most kMostDuration (10 years): deadlines past the steady clock's range would wrap.
inline constexpr std::chrono::microseconds kMostDuration{int64_t{10} * 365 * 86400 * 1000000};
std::optional<std::chrono::microseconds> parse_duration(const std::string& text);
std::optional<bool> parse_bool(const std::string& text);

}  // namespace hmc::core
