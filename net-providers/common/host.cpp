#include "common/host.h"

#include <sys/random.h>

#include "hmc/provider/param_text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

namespace hmc_net {

Host::Host(const hmc_host_services_t& services, const char* provider)
    : services_(services), provider_(provider) {}

bool Host::check(const hmc_host_services_t* s, std::string& why) {
  if (s == nullptr) {
    why = "no host services";
  } else if (s->struct_size < sizeof(hmc_host_services_t)) {
    why = "host services table too small (" + std::to_string(s->struct_size) + " < " +
          std::to_string(sizeof(hmc_host_services_t)) + " bytes)";
  } else if (s->log == nullptr || s->config_get == nullptr || s->wake == nullptr) {
    why = "host services lack log, config_get or wake";
  } else {
    return true;
  }
  return false;
}

void Host::log(int level, const std::string& message) const {
  services_.log(services_.host, level, provider_, message.c_str());
}

bool Host::get_string(const hmc_param_t& param, std::string& out, std::string& why) const {
  char value[4096];
  int rc = services_.config_get(services_.host, param.name, value, sizeof(value));
  if (rc == 0) {
    out.assign(value, strnlen(value, sizeof(value)));
  } else if (rc == 1) {
    out = param.default_value;
  } else {
    why = std::string(param.name) + ": value too long or unreadable";
    return false;
  }
  return true;
}

bool Host::get_size(const hmc_param_t& param, uint64_t& out, std::string& why) const {
  std::string text;
  if (!get_string(param, text, why)) return false;
  if (parse_size(text, out)) return true;
  why = std::string(param.name) + ": malformed size '" + text +
        "' (expected bytes, e.g. 1048576, 64K or 4M)";
  return false;
}

bool Host::get_bool(const hmc_param_t& param, bool& out, std::string& why) const {
  std::string text;
  if (!get_string(param, text, why)) return false;
  if (parse_bool(text, out)) return true;
  why = std::string(param.name) + ": malformed bool '" + text + "' (expected 1/0, true/false)";
  return false;
}

bool Host::get_int(const hmc_param_t& param, int64_t min, int64_t max, int64_t& out,
                   std::string& why) const {
  std::string text;
  if (!get_string(param, text, why)) return false;
  // libhmc's grammar (strtoll's: " 5" and "+5" too): what it let through parses here.
  const auto value = hmc_text::parse_int(text);
  if (value && *value >= min && *value <= max) {
    out = *value;
    return true;
  }
  why = std::string(param.name) + ": malformed integer '" + text + "' (expected " +
        std::to_string(min) + ".." + std::to_string(max) + ")";
  return false;
}

bool parse_size(const std::string& text, uint64_t& out) {
  const auto bytes = hmc_text::parse_size(text);  // libhmc's grammar: what it let through parses here
  if (bytes) out = *bytes;
  return bytes.has_value();
}

bool parse_bool(const std::string& text, bool& out) {
  const auto value = hmc_text::parse_bool(text);
  if (value) out = *value;
  return value.has_value();
}

// From the kernel's generator: 0.3 us here. libstdc++'s random_device prefers RDSEED where
// the CPU has it, which took 22 us per call on a KVM guest, 44 us per key, on every
// rendezvous into memory the caller allocated itself (a region key each).
uint64_t random_key() {
  uint64_t k = 0;
  while (k == 0) {
    if (getrandom(&k, sizeof(k), 0) == static_cast<ssize_t>(sizeof(k))) continue;
    if (errno == EINTR) continue;
    static std::mutex mu;  // no getrandom (ENOSYS): the old way
    static std::random_device device;
    std::lock_guard lock(mu);
    k = (uint64_t{device()} << 32) ^ device();
  }
  return k;
}

void copy_text(const std::string& text, char* out, size_t cap) {
  if (out == nullptr || cap == 0) return;
  size_t n = std::min(text.size(), cap - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace hmc_net
