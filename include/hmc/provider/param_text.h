/* How libhmc reads the text of a parameter, for C++ providers that want the same grammar
 * (the C ABI itself hands values over as text: common.h, config_get). Header only. */
#pragma once

#ifdef __cplusplus
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace hmc_text {

// The number a size or a duration starts with, and its unit in lower case. strtod also
// reads "nan", "inf", hexadecimal ("0x10") and signs, which neither is: only digits, a
// point and a decimal exponent may make the number, and a '-' anywhere is refused ("-0",
// "1e-3K").
inline std::optional<std::pair<double, std::string>> number_and_unit(const std::string& text) {
  if (text.empty() || text.find('-') != std::string::npos) return std::nullopt;
  if (!std::isdigit(static_cast<unsigned char>(text[0])) && text[0] != '.') return std::nullopt;  // "+4K"
  // from_chars, not strtod: the decimal point stays '.' whatever locale the application set.
  double v = 0;
  const char* first = text.c_str();
  const auto [end, ec] = std::from_chars(first, first + text.size(), v, std::chars_format::general);
  if (ec != std::errc() || end == first || !(v >= 0) || !std::isfinite(v)) return std::nullopt;
  for (const char* c = first; c < end; ++c)
    if (!std::isdigit(static_cast<unsigned char>(*c)) && std::strchr(".eE+", *c) == nullptr) return std::nullopt;
  std::string unit(end);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::make_pair(v, std::move(unit));
}

// "HMC_<PROVIDER>_": how each of a provider's parameters must begin (upper case, '-' as
// '_': a shell exports no name with a '-').
inline std::string param_prefix(const std::string& provider) {
  std::string prefix = "HMC_" + provider + "_";
  std::transform(prefix.begin(), prefix.end(), prefix.begin(),
                 [](unsigned char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
  return prefix;
}

// A size in bytes: "1048576", "64K", "4MiB", "1.5m", "2T", "1e6"; nullopt when malformed,
// not a whole number of bytes, or 2^64 or more.
inline std::optional<uint64_t> parse_size(const std::string& text) {
  auto parsed = number_and_unit(text);
  if (!parsed) return std::nullopt;
  auto& [v, unit] = *parsed;
  // "b", and k, m, g, t alone or with "b", "i" or "ib" after them ("kb", "mib" -> "k", "m").
  if (unit == "b") unit.clear();
  else if (unit.size() == 3 && unit.compare(1, 2, "ib") == 0) unit.resize(1);
  else if (unit.size() == 2 && (unit[1] == 'b' || unit[1] == 'i')) unit.resize(1);
  double mul = 1;
  if (unit == "k") mul = 1024.0;
  else if (unit == "m") mul = 1024.0 * 1024;
  else if (unit == "g") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) return std::nullopt;
  // 2^64 and beyond do not fit (converting them is undefined): "1e30", "16777216T".
  const double bytes = v * mul;
  if (!(bytes < 18446744073709551616.0)) return std::nullopt;
  if (bytes != std::floor(bytes)) return std::nullopt;  // "1.5" bytes, "0.1K": not a whole number
  return static_cast<uint64_t>(bytes);
}

// A duration in microseconds, however long: "500us", "20ms", "30s", "2m", "1h", "10" (s).
inline std::optional<double> duration_us(const std::string& text) {
  auto parsed = number_and_unit(text);
  if (!parsed) return std::nullopt;
  const auto& [v, unit] = *parsed;
  if (unit.empty() || unit == "s") return v * 1e6;
  if (unit == "us") return v;
  if (unit == "ms") return v * 1e3;
  if (unit == "m" || unit == "min") return v * 60e6;
  if (unit == "h") return v * 3600e6;
  return std::nullopt;
}

// The longest duration libhmc takes: deadlines past the steady clock's range would wrap.
inline constexpr double kMostDurationUs = 10.0 * 365 * 86400 * 1e6;

// "1", "true", "yes", "on" and "0", "false", "no", "off", in any case.
inline std::optional<bool> parse_bool(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return std::nullopt;
}

// An int as strtoll reads one (leading blanks and a sign too), whole and in range.
inline std::optional<int64_t> parse_int(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Whether `text` is a value of the parameter type `type` ("int", "size", "bool",
// "duration"; "list" and "string" take any text), as libhmc checks before a provider's
// init: a provider's default must pass too.
inline bool valid(const std::string& type, const std::string& text) {
  if (type == "int") return parse_int(text).has_value();
  if (type == "size") return parse_size(text).has_value();
  if (type == "bool") return parse_bool(text).has_value();
  if (type == "duration") {
    const auto us = duration_us(text);
    return us && *us <= kMostDurationUs;
  }
  return type == "list" || type == "string";
}

}  // namespace hmc_text
#endif
