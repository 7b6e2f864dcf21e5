#include "core/config.h"

#include "hmc/provider/param_text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>

extern char** environ;

namespace hmc::core {
namespace {

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::kString: return "string";
    case ParamType::kInt: return "int";
    case ParamType::kSize: return "size";
    case ParamType::kBool: return "bool";
    case ParamType::kDuration: return "duration";
    case ParamType::kList: return "list";
    case ParamType::kForeign: return "foreign";
  }
  return "?";
}

std::optional<ParamType> type_from_name(const std::string& s) {
  if (s == "string") return ParamType::kString;
  if (s == "int") return ParamType::kInt;
  if (s == "size") return ParamType::kSize;
  if (s == "bool") return ParamType::kBool;
  if (s == "duration") return ParamType::kDuration;
  if (s == "list") return ParamType::kList;
  return std::nullopt;
}

Status validate(const ParamDef& def, const std::string& value) {
  const bool good = def.type == ParamType::kForeign || hmc_text::valid(type_name(def.type), value);
  if (!good && def.type == ParamType::kDuration && hmc_text::duration_us(value))
    return {ErrorCode::kInvalidArgument, "malformed " + def.name + "='" + value + "': longer than 10 years, the most a duration may be"};
  if (!def.choices.empty() && std::find(def.choices.begin(), def.choices.end(), value) == def.choices.end()) {
    std::string expected;
    for (std::size_t i = 0; i < def.choices.size(); ++i)
      expected += (i == 0 ? "'" : i + 1 == def.choices.size() ? " or '" : ", '") + def.choices[i] + "'";
    return {ErrorCode::kInvalidArgument, "malformed " + def.name + "='" + value + "': expected " + expected};
  }
  if (good) return {};
  return {ErrorCode::kInvalidArgument,
          "malformed " + def.name + "='" + value + "': expected " + (def.type == ParamType::kInt ? "an " : "a ") +
              type_name(def.type)};
}

}  // namespace

std::optional<uint64_t> parse_size(const std::string& text) { return hmc_text::parse_size(text); }

// Deadlines are the steady clock's now plus a duration, in nanoseconds of int64_t: about 292
// years from the clock's start. Longer ones would wrap into the past ("HMC_CREDIT_WAIT=1e10",
// meant as never), so a duration is at most kMostDuration.
std::optional<std::chrono::microseconds> parse_duration(const std::string& text) {
  static_assert(hmc_text::kMostDurationUs == static_cast<double>(kMostDuration.count()));
  auto us = hmc_text::duration_us(text);
  if (!us || !(*us <= hmc_text::kMostDurationUs)) return std::nullopt;
  return std::chrono::microseconds(static_cast<int64_t>(*us));
}

std::optional<bool> parse_bool(const std::string& text) { return hmc_text::parse_bool(text); }

const std::vector<ParamDef>& Config::core_params() {
  static const std::vector<ParamDef> kParams = {
      {"HMC_LOG_LEVEL", ParamType::kString, "warn", "log level: trace, debug, info, warn, error, off", "core",
       {"trace", "debug", "info", "warn", "error", "off"}},
      {"HMC_TIMEOUT", ParamType::kDuration, "60s", "deadline of every blocking call (e.g. 500ms, 30s, 2m); wait_all counts one for all its requests"},
      {"HMC_PROVIDERS", ParamType::kList, "", "providers to use: 'a,b' keeps only those, '^c' excludes c; every name must be a provider found (else Context::create fails)"},
      {"HMC_PROVIDER_PATH", ParamType::kString, "", "colon-separated folders searched for provider plugins before the one next to libhmc"},
      {"HMC_PATH", ParamType::kString, "", "force a net provider: 'tcp' for every pair, or per pair class 'same_host=shm,remote=tcp'"},
      {"HMC_EAGER_LIMIT", ParamType::kSize, "64K", "messages up to this size are sent eagerly; larger ones by rendezvous put. Unset, a pair's limit may be lower where its net provider advises it (shm: 16K; ucx over shared memory: 32K); set, it holds for every pair (set alike on every rank)"},
      {"HMC_EAGER_WINDOW", ParamType::kSize, "256K", "eager flow control: bytes of eager messages (each with its 40-byte header) a rank may have sent to one peer that the peer's application has not received yet; past it, small messages wait for credit (HMC_CREDIT_WAIT), then go by rendezvous until the peer catches up, so a receiver that falls behind buffers at most this much per sender. Unset, pairs on different hosts get 1M (their credit comes back later), and every pair at least 16 times its eager limit (tcp on one host: 1M); set, at least four messages of the pair's eager limit; 0: no bound (set alike on every rank)"},
      {"HMC_CREDIT_WAIT", ParamType::kDuration, "200us", "eager flow control: how long a small send that finds its peer's eager window full waits for the peer's credit before it goes by rendezvous (later sends to that peer wait behind it); unset, pairs on one host get 0: at once (a rendezvous there costs little and moves the copy to the sender)"},
      {"HMC_BOOTSTRAP_ADDR", ParamType::kString, "", "address put into unique ids for peers to reach the bootstrap root (default: this host name's IPv4 address; for split, the address of the parent communicator's control connection)"},
      {"HMC_ALGO", ParamType::kString, "", "force collective algorithms: 'ring', 'rd', 'rhd', 'tree', 'pairwise', 'linear', 'dissemination' or 'auto', or per collective 'all_reduce=ring,all_gather=rd' (docs/collectives.md says which fits which)"},
      {"HMC_MEM_QUERY", ParamType::kBool, "1", "ask the device providers that can (cuda) whether memory HMC did not allocate is theirs, so that an application's own device buffers (cudaMalloc, a framework's pool) move with the device's copies; costs a driver query on every send and receive of such memory, host memory included (0: memory HMC did not allocate is host memory)"},
      {"HMC_HOST_REGISTER", ParamType::kSize, "1M", "host memory a device copies this much or more of at once (an HMC allocation, a peer's buffer imported for IPC) is registered (page-locked) with that device's provider for pinned copy speed; 0: never"},
      {"HMC_RNDV", ParamType::kString, "auto", "how a rendezvous moves its data: 'put' (the receiver's CTS carries its buffer's key, the sender puts), 'get' (the sender's RTS carries its buffer's key, the receiver reads it, where the path provider can get), or 'auto': get up to the size the provider advises for the pair class (ucx over shared memory: 512K, and from 1.5M) when the send buffer is an HMC allocation, else put; 'split' splits every rendezvous the provider can get (HMC_RNDV_SPLIT)", "core", {"auto", "put", "get", "split"}},
      {"HMC_RNDV_SPLIT", ParamType::kSize, "128K", "with HMC_RNDV=auto, rendezvous messages of this size and larger between ranks of one host, where the provider advises gets (ucx over shared memory) and both buffers are HMC allocations, are split: the sender puts the first half while the receiver gets the second, so two cores copy at once (not where either rank has a rendezvous of its own under way the other way: both copy already); 0: never"},
      {"HMC_RNDV_TURNS", ParamType::kSize, "64K", "with HMC_RNDV=auto, between ranks of one host where the provider advises gets (ucx over shared memory), rendezvous messages of this size and larger that are not split are copied in turns: a receiver that got the last one from a peer asks the sender to put the next if it goes into another buffer, so both ranks copy a stream (only in a stream: more from that peer posted for or arrived; not where either rank has a rendezvous of its own under way the other way: it copies already); 0: the receiver gets every one"},
      {"HMC_STAGE_CHUNK", ParamType::kSize, "4M", "device messages staged through host memory move in chunks of this size (at least 4K: smaller counts as 4K): one chunk's device copy overlaps the previous chunk's transfer"},
      {"HMC_IPC_ASYNC", ParamType::kBool, "1", "IPC writes from device memory run on a device stream and complete from progress (0: each copy blocks the progress pass)"},
      {"HMC_COLL_CHUNK", ParamType::kSize, "1M", "collectives cut messages into chunks of this size so transfer and reduction overlap (0: 1M)"},
      {"HMC_COLL_MAX_CHUNKS", ParamType::kInt, "64", "larger collectives use chunks of size/HMC_COLL_MAX_CHUNKS instead (fewer handshakes; set alike on every rank; 0 or less: no such cap)"},
      {"HMC_CCL", ParamType::kString, "auto", "delegate collectives to a vendor library (nccl) when every rank's buffers are on its devices: 'auto' or 'off'", "core", {"auto", "off"}},
      {"HMC_STREAM_STAGE", ParamType::kBool, "1", "stream-ordered collectives copy their device buffers through registered host memory on the stream, so that they queue no device work after the call (0: they run on the device buffers, faster on one host, and hang wherever streams share a hardware queue)"},
      {"HMC_STREAM_STAGE_MAX", ParamType::kSize, "1G", "registered host memory one communicator keeps for that staging; a stream-ordered call that would need more waits (up to HMC_TIMEOUT) until its stream has passed earlier calls and returned theirs; with none in flight, kept blocks that fit no call are unregistered first. One call may always exceed it"},
      {"HMC_COLL_CHECK", ParamType::kBool, "0", "verify that all ranks pass matching collective arguments (an extra small exchange)"},
      {"HMC_SHM_COLL", ParamType::kBool, "1", "all_reduce, reduce, all_gather, all_to_all, reduce_scatter, broadcast and barrier go through shared-memory segments when every rank runs on this host and has no device but the CPU (set alike on every rank)"},
      {"HMC_SHM_COLL_MAX", ParamType::kSize, "0", "only collectives of up to this much input per rank go through the shared-memory segments of HMC_SHM_COLL; 0: no limit (set alike on every rank; 4K suits buffers from Context::alloc(kShareable), see docs/collectives.md)"},
      {"HMC_YIELD_EVERY", ParamType::kInt, "0", "a waiting thread calls sched_yield after this many unproductive polls; 0 (automatic): 8 while this host's ranks have a CPU each (for messages over providers with threads of their own, tcp and shm, two each, and this rank's binding allows two), else 1; at most 1048576"},
      {"HMC_HOST_ID", ParamType::kString, "", "override this host's identity (ranks with equal ids count as one host)"},
      {"HMC_RANK", ParamType::kInt, "", "this process's rank (Communicator::from_env)"},
      {"HMC_WORLD_SIZE", ParamType::kInt, "", "number of ranks (Communicator::from_env)"},
      {"HMC_ROOT", ParamType::kString, "", "bootstrap root 'host:port', or a whole unique id 'hmc1:...' (from_env)"},
      {"HMC_SECRET", ParamType::kString, "", "job secret as 32 hex digits (from_env; else derived from the launcher's job id and the root's address, which anyone who knows both can derive: set it where others reach the network; this table never shows it)"},
      {"RANK", ParamType::kForeign, "", "torchrun: rank (read by from_env)"},
      {"WORLD_SIZE", ParamType::kForeign, "", "torchrun: number of ranks"},
      {"MASTER_ADDR", ParamType::kForeign, "", "torchrun: rank 0's address, hosts the bootstrap root"},
      {"MASTER_PORT", ParamType::kForeign, "", "torchrun: its store's port; the bootstrap root listens on the next one"},
      {"TORCHELASTIC_RUN_ID", ParamType::kForeign, "", "torchrun: job id, seeds the job secret when HMC_SECRET is unset"},
      {"OMPI_COMM_WORLD_RANK", ParamType::kForeign, "", "Open MPI: rank"},
      {"OMPI_COMM_WORLD_SIZE", ParamType::kForeign, "", "Open MPI: number of ranks"},
      {"OMPI_MCA_orte_hnp_uri", ParamType::kForeign, "", "Open MPI: job id, seeds the job secret when HMC_SECRET is unset"},
  };
  return kParams;
}

Result<Config> Config::load(const std::map<std::string, std::string>& overrides) {
  Config c;
  for (const auto& d : core_params()) c.defs_[d.name] = d;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    bool ours = name.rfind("HMC_", 0) == 0 || c.defs_.count(name);
    // An empty variable counts as unset: launchers and scripts export `HMC_RANK=` (or
    // `RANK=`) for "none", and that must neither fail as a malformed int nor hide the
    // launcher's variable that from_env reads next.
    if (ours && eq + 1 < kv.size()) c.values_[name] = {kv.substr(eq + 1), "env"};
  }
  for (const auto& [name, value] : overrides) {
    if (!c.defs_.count(name) && name.rfind("HMC_", 0) != 0)
      return Status(ErrorCode::kInvalidArgument, "unknown setting '" + name + "' in ContextOptions");
    c.values_[name] = {value, "option"};
  }
  for (const auto& [name, def] : c.defs_) {
    auto it = c.values_.find(name);
    if (it != c.values_.end()) HMC_RETURN_IF_ERROR(validate(def, it->second.first));
  }
  return c;
}

std::string param_prefix(const std::string& provider) { return hmc_text::param_prefix(provider); }

std::string Config::bad_params(const std::string& owner, const hmc_param_t* params, std::size_t n) const {
  if (n > 0 && !params) return std::to_string(n) + " parameters listed but no table of them";
  const std::string prefix = param_prefix(owner);
  for (std::size_t i = 0; i < n; ++i) {
    const hmc_param_t& p = params[i];
    if (!p.name || !p.type) return "parameter " + std::to_string(i) + " without name or type";
    const std::string name = p.name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0)
      return "parameter " + name + " is not named " + prefix + "*";
    auto type = type_from_name(p.type);
    if (!type) return "parameter " + name + " has unknown type '" + p.type + "'";
    // The provider reads its default through config_get as if set: it must parse too.
    if (p.default_value && *p.default_value && !validate({name, *type, "", ""}, p.default_value).ok())
      return "parameter " + name + "'s default '" + p.default_value + "' is not a valid " + p.type;
    // A provider would otherwise change a setting of core's (its default, its type) or of
    // another provider's: shm's prefix holds core's HMC_SHM_COLL.
    if (auto d = defs_.find(name); d != defs_.end() && d->second.owner != owner)
      return "parameter " + name + " is " + (d->second.owner == "core" ? "core's" : d->second.owner + "'s") + " already";
  }
  return {};
}

Status Config::add_params(const std::string& owner, const hmc_param_t* params, std::size_t n) {
  if (std::string bad = bad_params(owner, params, n); !bad.empty()) return {ErrorCode::kInvalidArgument, owner + ": " + bad};
  for (std::size_t i = 0; i < n; ++i) {
    const hmc_param_t& p = params[i];
    auto type = type_from_name(p.type);
    ParamDef def{p.name, *type, p.default_value ? p.default_value : "", p.help ? p.help : "", owner};
    auto it = values_.find(def.name);
    if (it != values_.end()) HMC_RETURN_IF_ERROR(validate(def, it->second.first));
    defs_[def.name] = def;
  }
  return {};
}

std::optional<std::string> Config::text(const std::string& name) const {
  auto v = values_.find(name);
  if (v != values_.end()) return v->second.first;
  auto d = defs_.find(name);
  if (d != defs_.end()) return d->second.default_value;
  return std::nullopt;
}

bool Config::is_set(const std::string& name) const { return values_.count(name) > 0; }
std::string Config::str(const std::string& name) const { return text(name).value_or(""); }
int64_t Config::integer(const std::string& name) const { return std::strtoll(str(name).c_str(), nullptr, 10); }
uint64_t Config::size(const std::string& name) const { return parse_size(str(name)).value_or(0); }
bool Config::flag(const std::string& name) const { return parse_bool(str(name)).value_or(false); }
std::chrono::microseconds Config::duration(const std::string& name) const {
  return parse_duration(str(name)).value_or(std::chrono::microseconds(0));
}

std::vector<ConfigEntry> Config::entries() const {
  std::vector<ConfigEntry> out;
  for (const auto& [name, d] : defs_) {
    ConfigEntry e{name, type_name(d.type), d.default_value, d.help, d.default_value, "default"};
    if (d.owner != "core") e.help = "[" + d.owner + "] " + e.help;
    auto v = values_.find(name);
    if (v != values_.end()) { e.value = v->second.first; e.source = v->second.second; }
    // The job secret lets anyone who has it join the job: tables end up in bug reports.
    if (name == "HMC_SECRET" && !e.value.empty()) e.value = "(set; not shown)";
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Config::unclaimed() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, v] : values_)
    if (!defs_.count(name)) out.emplace_back(name, v.second);
  return out;
}

}  // namespace hmc::core
