// What a stream provider asks of libhmc: logging, parameter values, wake-ups.
//
// Parameters are read only through host->config_get (never getenv) and parsed
// against the provider's own hmc_param_t table, whose default text is the single
// source of defaults. A malformed value is an init error with a reason.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "hmc/provider/common.h"

namespace hmc_net {

class Host {
 public:
  Host(const hmc_host_services_t& services, const char* provider);

  // False with `why` when the services table is too small or lacks a callback.
  static bool check(const hmc_host_services_t* services, std::string& why);

  void log(int level, const std::string& message) const;
  void wake() const { services_.wake(services_.host); }
  const char* provider() const { return provider_; }

  // Each returns false with `why` naming the parameter when its value is malformed.
  bool get_string(const hmc_param_t& param, std::string& out, std::string& why) const;
  bool get_size(const hmc_param_t& param, uint64_t& out, std::string& why) const;
  bool get_bool(const hmc_param_t& param, bool& out, std::string& why) const;
  bool get_int(const hmc_param_t& param, int64_t min, int64_t max, int64_t& out,
               std::string& why) const;

 private:
  hmc_host_services_t services_;
  const char* provider_;
};

// Runs fn(provider) for an ABI entry point whose state is a P (with host()): exceptions
// become error codes, logged, so none crosses the C ABI.
template <class P, class F>
int guarded(void* state, F&& fn) {
  if (state == nullptr) return HMC_PROV_ERR_INVALID;
  auto* p = static_cast<P*>(state);
  try {
    return fn(*p);
  } catch (const std::bad_alloc&) {
    return HMC_PROV_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    try {
      p->host().log(HMC_LOG_ERROR, std::string("unexpected error: ") + e.what());
    } catch (...) {
    }
    return HMC_PROV_ERR_INTERNAL;
  } catch (...) {
    return HMC_PROV_ERR_INTERNAL;
  }
}

// Parsers, exposed for reuse: sizes as libhmc reads them (hmc/provider/param_text.h: "4M",
// "4MiB", "1.5m", "1048576"); "1/0/true/false/on/off/yes/no".
bool parse_size(const std::string& text, uint64_t& out);
bool parse_bool(const std::string& text, bool& out);

// A random 64-bit number, never 0 (region keys, ring nonces).
uint64_t random_key();

// Copies `text` into a C buffer, truncating, always NUL-terminated when cap > 0.
void copy_text(const std::string& text, char* out, size_t cap);

}  // namespace hmc_net
