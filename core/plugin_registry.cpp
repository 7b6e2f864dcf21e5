#include "core/plugin_registry.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/log.h"
#include "core/progress.h"

extern "C" const hmc_device_provider_t* hmc_builtin_device_cpu(void);

namespace hmc::core {
namespace fs = std::filesystem;

struct PluginRegistry::Candidate {
  std::string kind;  // "device" or "net"
  std::string name;
  std::string path;  // empty for built-ins
};

namespace {

void host_log(void* host, int level, const char* provider, const char* message) {
  auto* p = static_cast<LoadedProvider*>(host);
  auto lvl = static_cast<spdlog::level::level_enum>(level < 0 ? 0 : level > 4 ? 4 : level);
  logger(p ? p->log_name : std::string("prov.") + (provider ? provider : "?"))->log(lvl, "{}", message ? message : "");
}

int host_config_get(void* host, const char* name, char* value, size_t value_len) {
  auto* p = static_cast<LoadedProvider*>(host);
  if (!p || !name || !value) return HMC_PROV_ERR_INVALID;
  auto v = p->config->text(name);
  if (!v || (!p->config->is_set(name) && v->empty())) return 1;
  if (v->size() + 1 > value_len) return HMC_PROV_ERR_INVALID;
  std::memcpy(value, v->c_str(), v->size() + 1);
  return 0;
}

void host_wake(void* host) {
  auto* p = static_cast<LoadedProvider*>(host);
  if (p && p->engine) p->engine->wake();
}

std::string libhmc_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&libhmc_dir), &info) && info.dli_fname)
    return fs::path(info.dli_fname).parent_path().string();
  return {};
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Capability bits that promise function pointers: a set bit with a NULL pointer is a broken plugin.
std::string check_device_table(const hmc_device_provider_t* t) {
  if (!t->init || !t->fini || !t->last_error || !t->device_count || !t->device_info || !t->mem_alloc ||
      !t->mem_free || !t->copy)
    return "a mandatory function (init, fini, last_error, device_count, device_info, mem_alloc, mem_free, copy) is NULL";
  auto need = [&](uint64_t bit, bool ok, const char* what) -> std::string {
    return (t->caps & bit) && !ok ? std::string("capability ") + what + " set but its functions are NULL" : "";
  };
  for (auto msg : {need(HMC_DEV_CAP_STREAMS, t->stream_create && t->stream_destroy && t->stream_query && t->event_create &&
                                                 t->event_destroy && t->event_record && t->stream_wait_event && t->event_query, "streams"),
                   need(HMC_DEV_CAP_REDUCE, t->reduce && t->divide, "reduce"),
                   need(HMC_DEV_CAP_IPC, t->ipc_export && t->ipc_import && t->ipc_close, "ipc"),
                   need(HMC_DEV_CAP_DMABUF, t->dmabuf_export, "dmabuf"),
                   need(HMC_DEV_CAP_PEER_ACCESS, t->peer_access, "peer_access")})
    if (!msg.empty()) return msg;
  // Appended functions: only read when the table is long enough to hold them.
  if (t->caps & HMC_DEV_CAP_STREAM_FLAGS) {
    if (t->struct_size < offsetof(hmc_device_provider_t, host_register))
      return "capability stream_flags set but the table is too short to hold its functions";
    if (!t->flag_alloc || !t->flag_free || !t->stream_wait_flag) return "capability stream_flags set but its functions are NULL";
  }
  if (t->caps & HMC_DEV_CAP_HOST_REGISTER) {
    if (t->struct_size < offsetof(hmc_device_provider_t, host_unregister) + sizeof(t->host_unregister))
      return "capability host_register set but the table is too short to hold its functions";
    if (!t->host_register || !t->host_unregister) return "capability host_register set but its functions are NULL";
  }
  if (t->caps & HMC_DEV_CAP_MEM_QUERY) {
    if (t->struct_size < offsetof(hmc_device_provider_t, mem_query) + sizeof(t->mem_query))
      return "capability mem_query set but the table is too short to hold it";
    if (!t->mem_query) return "capability mem_query set but mem_query is NULL";
  }
  if (t->caps & HMC_DEV_CAP_IPC_EXTENT) {
    if (t->struct_size < offsetof(hmc_device_provider_t, ipc_extent) + sizeof(t->ipc_extent))
      return "capability ipc_extent set but the table is too short to hold it";
    if (!t->ipc_extent) return "capability ipc_extent set but ipc_extent is NULL";
  }
  return {};
}

std::string check_net_table(const hmc_net_provider_t* t) {
  if (!t->init || !t->fini || !t->props || !t->listen || !t->close_listener || !t->connect || !t->conn_status ||
      !t->accept || !t->close_conn || !t->test || !t->progress)
    return "a mandatory function (init, fini, props, listen, close_listener, connect, conn_status, accept, close_conn, test, "
           "progress) is NULL";
  if ((t->caps & HMC_NET_CAP_MSG) == 0 || !t->send_msg || !t->recv_msg)
    return "capability msg is required (send_msg/recv_msg)";
  if ((t->caps & HMC_NET_CAP_PUT) && !(t->reg_mem && t->dereg_mem && t->pack_rkey && t->put))
    return "capability put set but its functions are NULL";
  // Appended functions: only read when the table is long enough to hold them.
  if (t->caps & HMC_NET_CAP_MEM_ALLOC) {
    if (t->struct_size < offsetof(hmc_net_provider_t, mem_free) + sizeof(t->mem_free))
      return "capability mem_alloc set but the table is too short to hold its functions";
    if (!(t->caps & HMC_NET_CAP_PUT) || !t->mem_alloc || !t->mem_free)
      return "capability mem_alloc set but its functions are NULL (or put is missing)";
  }
  if (t->caps & HMC_NET_CAP_GET) {
    if (t->struct_size < offsetof(hmc_net_provider_t, get) + sizeof(t->get))
      return "capability get set but the table is too short to hold it";
    if (!(t->caps & HMC_NET_CAP_PUT) || !t->get) return "capability get set but get is NULL (or put is missing)";
  }
  return {};
}

std::string check_ccl_table(const hmc_ccl_provider_t* t) {
  if (!t->device_provider || !t->init || !t->fini || !t->last_error || !t->supports || !t->unique_id || !t->comm_init ||
      !t->comm_destroy || !t->comm_abort || !t->comm_status || !t->all_reduce || !t->broadcast || !t->reduce ||
      !t->all_gather || !t->reduce_scatter || !t->send || !t->recv || !t->group_start || !t->group_end)
    return "a function of the table (or device_provider) is NULL: every one is mandatory";
  return {};
}

}  // namespace

std::vector<std::string> device_cap_names(uint64_t caps) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {HMC_DEV_CAP_DEVICE_MEM, "device_mem"}, {HMC_DEV_CAP_PINNED_HOST, "pinned_host"},
      {HMC_DEV_CAP_SHAREABLE, "shareable"},   {HMC_DEV_CAP_STREAMS, "streams"},
      {HMC_DEV_CAP_REDUCE, "reduce"},         {HMC_DEV_CAP_IPC, "ipc"},
      {HMC_DEV_CAP_DMABUF, "dmabuf"},         {HMC_DEV_CAP_PEER_ACCESS, "peer_access"},
      {HMC_DEV_CAP_STREAM_FLAGS, "stream_flags"}, {HMC_DEV_CAP_HOST_REGISTER, "host_register"},
      {HMC_DEV_CAP_MEM_QUERY, "mem_query"}, {HMC_DEV_CAP_IPC_EXTENT, "ipc_extent"}};
  std::vector<std::string> out;
  for (auto& [bit, name] : kNames)
    if (caps & bit) out.push_back(name);
  return out;
}

std::vector<std::string> net_cap_names(uint64_t caps) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {HMC_NET_CAP_MSG, "msg"},           {HMC_NET_CAP_PUT, "put"},
      {HMC_NET_CAP_REMOTE, "remote"},     {HMC_NET_CAP_SAME_HOST, "same_host"},
      {HMC_NET_CAP_MEM_HOST, "mem_host"}, {HMC_NET_CAP_MEM_DMABUF, "mem_dmabuf"},
      {HMC_NET_CAP_MEM_PEER, "mem_peer"}, {HMC_NET_CAP_SINGLE_COPY, "single_copy"},
      {HMC_NET_CAP_MEM_ALLOC, "mem_alloc"}, {HMC_NET_CAP_GET, "get"},
      {HMC_NET_CAP_POLLED, "polled"}};
  std::vector<std::string> out;
  for (auto& [bit, name] : kNames)
    if (caps & bit) out.push_back(name);
  return out;
}

LoadedProvider::~LoadedProvider() {
  if (initialised) {  // a provider may keep its state elsewhere and leave *state NULL
    if (dev) dev->fini(state);
    if (net) net->fini(state);
    if (ccl) ccl->fini(state);
  }
  if (dl) dlclose(dl);
}

PluginRegistry::~PluginRegistry() {
  ccls_.clear();  // collective providers work on device memory and streams: finalise them first
  nets_.clear();  // nets may hold registrations of device memory: finalise them before devices
  devices_.clear();
}

Result<std::unique_ptr<PluginRegistry>> PluginRegistry::load(Config& config, ProgressEngine& engine) {
  auto reg = std::unique_ptr<PluginRegistry>(new PluginRegistry());
  for (auto& d : split(config.str("HMC_PROVIDER_PATH"), ':')) reg->search_path_.push_back(d);
  if (auto here = libhmc_dir(); !here.empty()) reg->search_path_.push_back(here);

  // Discovery: file names only, first of a name wins, built-ins last.
  std::vector<Candidate> found;
  std::set<std::string> seen;
  const std::size_t own_dirs = reg->search_path_.size() - (libhmc_dir().empty() ? 0 : 1);
  for (std::size_t d = 0; d < reg->search_path_.size(); ++d) {
    const std::string& dir = reg->search_path_[d];
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) files.push_back(entry.path());
    // A folder the user named that cannot be read is a typo or a missing install, not
    // "no plugins there".
    if (ec && d < own_dirs) HMC_LOG("core", warn, "HMC_PROVIDER_PATH: cannot read {}: {}", dir, ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string file = f.filename().string();
      for (std::string kind : {"device", "net", "ccl"}) {
        std::string prefix = "libhmc-" + kind + "-";
        if (file.rfind(prefix, 0) != 0 || file.size() <= prefix.size() + 3 || file.substr(file.size() - 3) != ".so")
          continue;
        std::string name = file.substr(prefix.size(), file.size() - prefix.size() - 3);
        if (seen.insert(kind + "/" + name).second) found.push_back({kind, name, f.string()});
      }
    }
  }
  if (seen.insert("device/cpu").second) found.push_back({"device", "cpu", ""});

  // Selection. Every name given, kept or excluded, must be a provider found here: a typo
  // in an exclusion would otherwise keep the provider it meant to drop.
  const std::string selection = config.str("HMC_PROVIDERS");
  std::set<std::string> wanted, excluded;
  for (auto& item : split(selection, ',')) {
    const bool exclude = item[0] == '^';
    std::string name = exclude ? item.substr(1) : item;
    if (name.empty()) return Status(ErrorCode::kInvalidArgument, "HMC_PROVIDERS=" + selection + ": '^' without a name");
    (exclude ? excluded : wanted).insert(std::move(name));
  }
  if (!selection.empty() && wanted.empty() && excluded.empty())
    return Status(ErrorCode::kInvalidArgument, "HMC_PROVIDERS=" + selection + " names no provider");
  for (const auto* names : {&wanted, &excluded}) {
    for (const auto& w : *names) {
      bool exists = std::any_of(found.begin(), found.end(), [&](const Candidate& c) { return c.name == w; });
      if (exists) continue;
      std::string dirs;
      for (auto& d : reg->search_path_) dirs += (dirs.empty() ? "" : ", ") + d;
      return Status(ErrorCode::kNotFound, "HMC_PROVIDERS " + std::string(names == &wanted ? "names" : "excludes") + " '" +
                                              w + "' but no provider of that name was found (searched: " + dirs + ")");
    }
  }
  for (const auto& c : found) {
    bool selected = (wanted.empty() || wanted.count(c.name)) && !excluded.count(c.name);
    // The cpu device provider serves host memory for everything else: keep it unless excluded by name.
    if (c.kind == "device" && c.name == "cpu" && !excluded.count("cpu")) selected = true;
    if (!selected) {
      reg->report_.push_back({c.name, c.kind, c.path.empty() ? "built-in" : c.path, 0, 0, {}, false,
                              "not selected (HMC_PROVIDERS=" + selection + ")"});
      continue;
    }
    HMC_RETURN_IF_ERROR(reg->load_one(c, wanted.count(c.name) > 0, config, engine));
    // Host memory needs a cpu provider: one of another build that would not load (its ABI,
    // a missing library) leaves the one inside libhmc, as the built-in of a name comes last.
    if (c.kind == "device" && c.name == "cpu" && !c.path.empty() && !reg->device("cpu")) {
      HMC_LOG("core", warn, "cpu device provider {} not used ({}); using the one built into libhmc", c.path,
              reg->report_.back().reason);
      HMC_RETURN_IF_ERROR(reg->load_one({"device", "cpu", ""}, false, config, engine));
    }
  }
  for (const auto& [name, source] : config.unclaimed()) {
    const char* where = source == "option" ? "in ContextOptions" : "in the environment";
    // A provider found but not used registered no parameters: a cluster-wide HMC_SHM_DIR
    // with HMC_PROVIDERS=cpu,tcp is no typo.
    auto owner = std::find_if(reg->report_.begin(), reg->report_.end(), [&](const ProviderInfo& p) {
      const std::string prefix = param_prefix(p.name);
      return !p.available && name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0;
    });
    if (owner != reg->report_.end())
      HMC_LOG("core", info, "setting {} ({}) is for provider {}, not used here: {}", name, where, owner->name, owner->reason);
    else
      HMC_LOG("core", warn, "unknown setting {} ({}) is ignored (hmc-probe config lists them all)", name, where);
  }
  return reg;
}

Status PluginRegistry::load_one(const Candidate& c, bool named, Config& config, ProgressEngine& engine) {
  ProviderInfo info{c.name, c.kind, c.path.empty() ? "built-in" : c.path, 0, 0, {}, false, ""};
  auto refuse = [&](std::string why) {
    info.reason = std::move(why);
    if (named) HMC_LOG("core", warn, "provider {} ({}), named in HMC_PROVIDERS, not used: {}", c.name, info.origin, info.reason);
    else HMC_LOG("core", info, "provider {} ({}) not used: {}", c.name, info.origin, info.reason);
    report_.push_back(info);
    return Status{};
  };
  auto p = std::make_unique<LoadedProvider>();
  p->name = c.name;
  p->origin = info.origin;
  p->log_name = "prov." + c.name;
  p->config = &config;
  p->engine = &engine;
  const void* table = nullptr;
  if (c.path.empty()) {
    table = hmc_builtin_device_cpu();
  } else {
    p->dl = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) return refuse(std::string("unavailable: cannot load: ") + dlerror());
    const char* entry = c.kind == "device" ? HMC_DEVICE_ENTRY_V1 : c.kind == "net" ? HMC_NET_ENTRY_V1 : HMC_CCL_ENTRY_V1;
    void* sym = dlsym(p->dl, entry);
    if (!sym) return refuse(std::string("refused: no entry symbol ") + entry + " (not an HMC provider, or a different ABI)");
    if (c.kind == "device") table = reinterpret_cast<hmc_device_entry_v1_fn>(sym)();
    else if (c.kind == "net") table = reinterpret_cast<hmc_net_entry_v1_fn>(sym)();
    else table = reinterpret_cast<hmc_ccl_entry_v1_fn>(sym)();
    if (!table) return refuse("refused: entry returned no table");
  }
  // struct_size, abi_version, name and caps open every table.
  struct Head { size_t struct_size; uint32_t abi_version; const char* name; uint64_t caps; };
  const auto* head = static_cast<const Head*>(table);
  uint32_t want_abi = c.kind == "device" ? HMC_DEVICE_ABI_VERSION : c.kind == "net" ? HMC_NET_ABI_VERSION : HMC_CCL_ABI_VERSION;
  // Tables from before the appended functions (device: stream flags; net: mem_alloc) still load.
  size_t want_size = c.kind == "device" ? offsetof(hmc_device_provider_t, flag_alloc)
                     : c.kind == "net"  ? offsetof(hmc_net_provider_t, mem_alloc)
                                        : sizeof(hmc_ccl_provider_t);
  info.abi_version = head->abi_version;
  info.caps = head->caps;
  if (head->abi_version != want_abi)
    return refuse("refused: ABI version " + std::to_string(head->abi_version) + ", this libhmc speaks " + std::to_string(want_abi));
  if (head->struct_size < want_size)
    return refuse("refused: table of " + std::to_string(head->struct_size) + " bytes, ABI v" + std::to_string(want_abi) + " needs " + std::to_string(want_size));
  if (!head->name || c.name != head->name)
    return refuse(std::string("refused: file says '") + c.name + "' but the table names '" + (head->name ? head->name : "(null)") + "'");
  std::string bad;
  const hmc_param_t* params = nullptr;
  size_t num_params = 0;
  if (c.kind == "device") {
    p->dev = static_cast<const hmc_device_provider_t*>(table);
    bad = check_device_table(p->dev);
    params = p->dev->params;
    num_params = p->dev->num_params;
    info.cap_names = device_cap_names(head->caps);
  } else if (c.kind == "net") {
    p->net = static_cast<const hmc_net_provider_t*>(table);
    bad = check_net_table(p->net);
    params = p->net->params;
    num_params = p->net->num_params;
    info.cap_names = net_cap_names(head->caps);
  } else {
    p->ccl = static_cast<const hmc_ccl_provider_t*>(table);
    bad = check_ccl_table(p->ccl);
    params = p->ccl->params;
    num_params = p->ccl->num_params;
  }
  if (bad.empty()) bad = config.bad_params(c.name, params, num_params);
  if (!bad.empty()) return refuse("refused: " + bad);
  HMC_RETURN_IF_ERROR(config.add_params(c.name, params, num_params));  // a malformed value of the user's

  p->services = {sizeof(hmc_host_services_t), p.get(), host_log, host_config_get, host_wake};
  char reason[512] = {0};
  int rc = p->dev   ? p->dev->init(&p->services, &p->state, reason, sizeof(reason))
           : p->net ? p->net->init(&p->services, &p->state, reason, sizeof(reason))
                    : p->ccl->init(&p->services, &p->state, reason, sizeof(reason));
  reason[sizeof(reason) - 1] = 0;  // a provider that filled it to the end
  if (rc != HMC_PROV_OK) {
    p->state = nullptr;
    std::string why = reason[0] ? reason : "init failed with code " + std::to_string(rc);
    // A setting the provider refused was set by someone on purpose: say so above info.
    if (rc == HMC_PROV_ERR_INVALID)
      HMC_LOG("core", warn, "provider {} not used: a setting of its is invalid: {}", c.name, why);
    return refuse("unavailable: " + why);
  }
  p->initialised = true;
  if (p->dev) {
    int n = 0;
    if (p->dev->device_count(p->state, &n) != 0 || n <= 0) return refuse("unavailable: no device");
    info.available = true;
    report_.push_back(info);
    devices_.push_back(std::move(p));
  } else if (p->ccl) {
    info.available = true;
    report_.push_back(info);
    ccls_.push_back(std::move(p));
  } else {
    p->net_props.struct_size = sizeof(hmc_net_props_t);
    if (p->net->props(p->state, &p->net_props) != 0) return refuse("unavailable: props query failed");
    p->net_caps = p->net->caps & ~p->net_props.caps_absent;
    if (p->net->struct_size >= offsetof(hmc_net_provider_t, events) + sizeof(p->net->events))
      p->net_events = p->net->events;
    if (p->net->struct_size >= offsetof(hmc_net_provider_t, idle) + sizeof(p->net->idle))
      p->net_idle = p->net->idle;
    if (!(p->net_caps & HMC_NET_CAP_MSG)) return refuse("unavailable: withdrew its messages (props caps_absent)");
    info.caps = p->net_caps;
    info.cap_names = net_cap_names(p->net_caps);
    info.available = true;
    report_.push_back(info);
    nets_.push_back(std::move(p));
  }
  return {};
}

LoadedProvider* PluginRegistry::device(const std::string& name) const {
  for (auto& p : devices_)
    if (p->name == name) return p.get();
  return nullptr;
}

LoadedProvider* PluginRegistry::ccl(const std::string& name) const {
  for (auto& p : ccls_)
    if (p->name == name) return p.get();
  return nullptr;
}

LoadedProvider* PluginRegistry::net(const std::string& name) const {
  for (auto& p : nets_)
    if (p->name == name) return p.get();
  return nullptr;
}

std::string provider_error_name(int rc) {
  switch (rc) {
    case HMC_PROV_ERR_INTERNAL: return "HMC_PROV_ERR_INTERNAL";
    case HMC_PROV_ERR_INVALID: return "HMC_PROV_ERR_INVALID";
    case HMC_PROV_ERR_UNSUPPORTED: return "HMC_PROV_ERR_UNSUPPORTED";
    case HMC_PROV_ERR_UNAVAILABLE: return "HMC_PROV_ERR_UNAVAILABLE";
    case HMC_PROV_ERR_NO_MEMORY: return "HMC_PROV_ERR_NO_MEMORY";
    case HMC_PROV_ERR_PEER_LOST: return "HMC_PROV_ERR_PEER_LOST";
    case HMC_PROV_ERR_REFUSED: return "HMC_PROV_ERR_REFUSED";
    case HMC_PROV_ERR_OUT_OF_BOUNDS: return "HMC_PROV_ERR_OUT_OF_BOUNDS";
    case HMC_PROV_ERR_TRUNCATED: return "HMC_PROV_ERR_TRUNCATED";
    case HMC_PROV_ERR_CLOSED: return "HMC_PROV_ERR_CLOSED";
    default: return "provider code " + std::to_string(rc);
  }
}

}  // namespace hmc::core
