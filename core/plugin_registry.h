// PluginRegistry: finds, selects, validates and loads device, net and collective providers.
//
// Discovery is cheap (file names only): HMC_PROVIDER_PATH folders first, then the folder
// holding libhmc, then the providers built into libhmc. The first provider of a name wins.
// HMC_PROVIDERS selects ('a,b') and excludes ('^c'). Only selected providers are dlopen'ed,
// validated (struct size, ABI version, name, capability bits against function pointers)
// and initialised; every refusal is recorded with its reason for hmc-probe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "hmc/context.h"
#include "hmc/provider/ccl.h"
#include "hmc/provider/device.h"
#include "hmc/provider/net.h"
#include "hmc/status.h"

namespace hmc::core {

class ProgressEngine;

// A loaded, initialised provider; finalises and unloads itself (RAII).
struct LoadedProvider {
  std::string name;
  std::string origin;
  void* dl = nullptr;  // dlopen handle; null for built-ins
  void* state = nullptr;
  bool initialised = false;  // init succeeded: fini runs, whatever state holds
  const hmc_device_provider_t* dev = nullptr;
  const hmc_net_provider_t* net = nullptr;
  const hmc_ccl_provider_t* ccl = nullptr;
  hmc_net_props_t net_props{};
  uint64_t net_caps = 0;  // the table's caps less what props withdrew (caps_absent)
  // The table's `events` where it has one (net.h; appended to ABI v1), else null.
  uint64_t (*net_events)(void* state) = nullptr;
  // The table's `idle` where it has one (net.h; appended to ABI v1), else null.
  void (*net_idle)(void* state) = nullptr;
  hmc_host_services_t services{};
  std::string log_name;  // "prov.<name>"
  Config* config = nullptr;
  ProgressEngine* engine = nullptr;
  // Net providers: how many communicators have a peer on this provider. Waiters poll only
  // providers in use: an idle UCX worker cost every poll of a shm job 41 ns (of 169).
  std::atomic<int> users{0};
  ~LoadedProvider();
};

class PluginRegistry {
 public:
  // `host` is passed to providers as their host services context (Config + wake).
  static Result<std::unique_ptr<PluginRegistry>> load(Config& config, ProgressEngine& engine);
  ~PluginRegistry();

  const std::vector<std::unique_ptr<LoadedProvider>>& devices() const { return devices_; }
  const std::vector<std::unique_ptr<LoadedProvider>>& nets() const { return nets_; }
  const std::vector<std::unique_ptr<LoadedProvider>>& ccls() const { return ccls_; }
  LoadedProvider* device(const std::string& name) const;
  LoadedProvider* net(const std::string& name) const;
  LoadedProvider* ccl(const std::string& name) const;
  // Every provider seen, loaded or not, with the reason when not.
  const std::vector<ProviderInfo>& report() const { return report_; }
  // The folders searched, in order (for messages).
  const std::vector<std::string>& search_path() const { return search_path_; }

 private:
  struct Candidate;
  // `named`: HMC_PROVIDERS names it, so a refusal is a warning (it was asked for), not info.
  Status load_one(const Candidate& c, bool named, Config& config, ProgressEngine& engine);

  std::vector<std::unique_ptr<LoadedProvider>> devices_;
  std::vector<std::unique_ptr<LoadedProvider>> nets_;
  std::vector<std::unique_ptr<LoadedProvider>> ccls_;
  std::vector<ProviderInfo> report_;
  std::vector<std::string> search_path_;
};

std::vector<std::string> device_cap_names(uint64_t caps);
std::vector<std::string> net_cap_names(uint64_t caps);

// "HMC_PROV_ERR_REFUSED", ... for a provider's return code (include/hmc/provider/common.h).
std::string provider_error_name(int rc);

}  // namespace hmc::core
