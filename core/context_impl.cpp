#include "core/context_impl.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "core/bootstrap.h"
#include "core/ipc_imports.h"
#include "core/log.h"
#include "core/path_negotiation.h"

namespace hmc::core {
namespace {

// Allocation ids count per process, not per context: a peer keys its imports of this
// process's memory by them (ipc_imports.h), whichever context made the allocation.
uint64_t next_alloc_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::string read_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string local_hostname() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The address peers most likely reach: the hostname's IPv4 address, else loopback.
std::string hostname_ipv4() {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  std::string out = "127.0.0.1";
  if (getaddrinfo(local_hostname().c_str(), nullptr, &hints, &res) == 0) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      char buf[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out = buf;
      break;
    }
    freeaddrinfo(res);
  }
  return out;
}

int alloc_kind_code(AllocKind kind) {
  switch (kind) {
    case AllocKind::kPinnedHost: return HMC_ALLOC_PINNED_HOST;
    case AllocKind::kShareable: return HMC_ALLOC_SHAREABLE;
    default: return HMC_ALLOC_DEVICE;
  }
}

// Host memory comes from a net provider's mem_alloc (memory that provider puts into
// fastest: ucx over shared memory) when every pair of every communicator will use that
// provider: it is the only net provider loaded (HMC_PROVIDERS), or HMC_PATH forces it for
// both pair classes. Paths are negotiated later, per communicator; without one of these
// the winner is not known here, and host memory stays the cpu provider's.
LoadedProvider* pick_net_allocator(const PluginRegistry& reg, const Config& config) {
  auto offers = [](LoadedProvider* n) { return n && (n->net_caps & HMC_NET_CAP_MEM_ALLOC) ? n : nullptr; };
  if (reg.nets().size() == 1) return offers(reg.nets()[0].get());
  auto policy = PathPolicy::parse(config.str("HMC_PATH"));
  if (!policy) return nullptr;  // malformed: create() refuses it
  const auto& forced = policy->forced;
  auto same = forced.find("same_host"), remote = forced.find("remote");
  if (same == forced.end() || remote == forced.end() || same->second != remote->second) return nullptr;
  return offers(reg.net(same->second));
}

}  // namespace

std::string provider_error(const LoadedProvider& p) {
  const char* e = p.dev ? p.dev->last_error(p.state) : p.ccl ? p.ccl->last_error(p.state) : nullptr;
  return e && *e ? e : "no detail";
}

Result<std::unique_ptr<ContextImpl>> ContextImpl::create(const ContextOptions& options) {
  auto ctx = std::unique_ptr<ContextImpl>(new ContextImpl());
  auto cfg = Config::load(options.settings);
  if (!cfg) return cfg.status();
  ctx->config_ = std::move(cfg.value());
  if (!set_log_level(ctx->config_.str("HMC_LOG_LEVEL")))
    return Status(ErrorCode::kInvalidArgument, "malformed HMC_LOG_LEVEL='" + ctx->config_.str("HMC_LOG_LEVEL") +
                                                   "': expected trace, debug, info, warn, error or off");
  // Checked here rather than when a communicator negotiates its paths: a typo should stop
  // the program where it starts (the other strings with a grammar are checked by Config).
  auto policy = PathPolicy::parse(ctx->config_.str("HMC_PATH"));
  if (!policy) return policy.status();
  // Kept in milliseconds, rounded up: 500us is a deadline of 1 ms, not none.
  ctx->timeout_ = std::chrono::ceil<std::chrono::milliseconds>(ctx->config_.duration("HMC_TIMEOUT"));
  if (ctx->timeout_.count() <= 0) return Status(ErrorCode::kInvalidArgument, "HMC_TIMEOUT must be positive");
  ctx->engine_->default_timeout = ctx->timeout_;
  ctx->yield_every_ = ctx->config_.integer("HMC_YIELD_EVERY");
  // Polls between yields, counted in int (and 200 times that before a waiter sleeps).
  constexpr int64_t kMostYieldEvery = 1 << 20;
  if (ctx->yield_every_ < 0 || ctx->yield_every_ > kMostYieldEvery)
    return Status(ErrorCode::kInvalidArgument, "HMC_YIELD_EVERY must be 0 (automatic) to " +
                                                   std::to_string(kMostYieldEvery) + ", got " +
                                                   std::to_string(ctx->yield_every_));
  ctx->note_host_ranks(1, false);
  ctx->host_register_min_ = ctx->config_.size("HMC_HOST_REGISTER");
  ctx->host_id_ = ctx->config_.str("HMC_HOST_ID");
  if (ctx->host_id_.empty()) ctx->host_id_ = local_hostname() + "/" + read_boot_id();
  auto reg = PluginRegistry::load(ctx->config_, *ctx->engine_);
  if (!reg) return reg.status();
  ctx->registry_ = std::move(reg.value());
  // A provider HMC_PATH forces should be one that was found (unavailable ones included:
  // they fail the pair with their reason when a communicator is made). One that is not may
  // be a typo, or a plugin this node lacks under a setting shared by the cluster (a pair
  // class this job may not use): a warning now, and the pairs that need it fail then.
  for (const auto& [pair, name] : policy->forced) {
    std::string known;
    bool found = false;
    for (const ProviderInfo& info : ctx->registry_->report())
      if (info.kind == "net") {
        found |= info.name == name;
        known += (known.empty() ? "" : ", ") + info.name;
      }
    if (!found)
      HMC_LOG("core", warn, "HMC_PATH forces '{}' for {} pairs, which is no net provider found here ({}): "
              "communicators with such pairs will fail", name, pair, known.empty() ? std::string("none") : known);
  }
  ctx->ipc_imports_ = std::make_unique<IpcImports>(*ctx);
  for (auto& n : ctx->registry_->nets()) {
    LoadedProvider* p = n.get();
    // A provider nobody uses is not polled either: nothing to tell it (ucx's thread would
    // wake and look at its worker before every sleep of every waiter).
    std::function<void()> idle;
    if (p->net_idle)
      idle = [p] {
        if (p->users.load(std::memory_order_relaxed) > 0) p->net_idle(p->state);
      };
    ctx->engine_->add_poller([p] { return p->users.load(std::memory_order_relaxed) > 0 && p->net->progress(p->state) > 0; },
                             std::move(idle));
  }
  if (!ctx->registry_->device("cpu")) {
    // Its reason says which (excluded, or refused: a malformed HMC_CPU_SIMD names itself).
    std::string why = "missing or excluded";
    for (const ProviderInfo& info : ctx->registry_->report())
      if (info.kind == "device" && info.name == "cpu" && !info.reason.empty()) why = info.reason;
    return Status(ErrorCode::kUnavailable, "the cpu device provider is unavailable (" + why + "); host memory needs it");
  }
  if (ctx->config_.flag("HMC_MEM_QUERY"))
    for (const auto& p : ctx->registry_->devices())
      if (p->dev->caps & HMC_DEV_CAP_MEM_QUERY) ctx->queriers_.push_back(p.get());
  ctx->net_alloc_ = pick_net_allocator(*ctx->registry_, ctx->config_);
  if (ctx->net_alloc_)
    HMC_LOG("core", debug, "host memory from Context::alloc comes from {}'s mem_alloc (every pair uses {})",
            ctx->net_alloc_->name, ctx->net_alloc_->name);
  return ctx;
}

ContextImpl::~ContextImpl() {
  // A root outliving its host's last call must still serve the other ranks' goodbyes.
  auto until = Clock::now() + std::min(timeout_, std::chrono::milliseconds(30000));
  for (auto& root : roots_)
    if (Status s = root->wait_finished(until); !s.ok())
      HMC_LOG("core", warn, "closing the bootstrap root before the job finished: {}", s.message());
  engine_->close();
  roots_.clear();
}

std::vector<DeviceInfo> ContextImpl::devices() const {
  std::vector<DeviceInfo> out;
  for (const auto& p : registry_->devices()) {
    int n = 0;
    p->dev->device_count(p->state, &n);
    for (int i = 0; i < n; ++i) {
      hmc_device_info_t raw{};
      raw.struct_size = sizeof(raw);
      if (p->dev->device_info(p->state, i, &raw) != 0) continue;
      // The provider's texts, bounded: one that fills a field leaves no NUL.
      auto text = [](const char* s, std::size_t cap) { return std::string(s, strnlen(s, cap)); };
      out.push_back({{p->name, i}, text(raw.vendor, sizeof(raw.vendor)), text(raw.model, sizeof(raw.model)),
                     text(raw.pci_bus_id, sizeof(raw.pci_bus_id)), raw.numa_node,
                     raw.mem_kind == HMC_MEM_DEVICE ? MemKind::kDevice : MemKind::kHost, raw.memory_bytes});
    }
  }
  return out;
}

Result<Memory> ContextImpl::alloc(const DeviceId& device, std::size_t bytes, AllocKind kind) {
  LoadedProvider* p = registry_->device(device.provider);
  if (!p) return Status(ErrorCode::kNotFound, "no device provider '" + device.provider + "' is loaded (hmc-probe lists them)");
  int n = 0;
  p->dev->device_count(p->state, &n);
  if (device.index < 0 || device.index >= n)
    return Status(ErrorCode::kInvalidArgument, "device " + device.to_string() + " does not exist (" + std::to_string(n) + " devices)");
  if (bytes == 0) return Status(ErrorCode::kInvalidArgument, "cannot allocate 0 bytes");
  hmc_device_info_t info{};
  info.struct_size = sizeof(info);
  const bool device_mem = kind != AllocKind::kPinnedHost && p->dev->device_info(p->state, device.index, &info) == 0 &&
                          info.mem_kind == HMC_MEM_DEVICE;
  // Host memory (not pinned: that is for staging) from the net allocator when there is one.
  void* mr = nullptr;
  LoadedProvider* net = net_alloc_ && p->name == "cpu" && kind != AllocKind::kPinnedHost ? net_alloc_ : nullptr;
  void* ptr = net ? net_alloc(bytes, &mr) : nullptr;
  if (!ptr) {
    net = nullptr;
    if (p->dev->mem_alloc(p->state, device.index, bytes, alloc_kind_code(kind), &ptr) != 0 || !ptr)
      return Status(ErrorCode::kNoMemory, "allocating " + std::to_string(bytes) + " bytes on " + device.to_string() + " failed: " + provider_error(*p));
  }
  {
    std::lock_guard lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(ptr)] = {bytes, p, device.index, next_alloc_id(), kind, device_mem, net, mr};
    if (device_mem) device_allocs_.fetch_add(1, std::memory_order_relaxed);
  }
  return Memory(this, device, ptr, bytes, kind);
}

void* ContextImpl::net_alloc(std::size_t bytes, void** mr) {
  void* ptr = nullptr;
  if (int rc = net_alloc_->net->mem_alloc(net_alloc_->state, bytes, &ptr, mr); rc != 0 || !ptr) {
    HMC_LOG("core", debug, "{} could not allocate {} bytes (code {}): the cpu provider does", net_alloc_->name, bytes, rc);
    return nullptr;
  }
  return ptr;
}

void ContextImpl::free(const DeviceId& device, void* ptr) {
  Allocation a{};
  {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end()) return;
    a = it->second;
    allocations_.erase(it);
    if (a.device_mem) device_allocs_.fetch_sub(1, std::memory_order_relaxed);
    free_generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (a.pinned_by && a.pinned_by->dev->host_unregister(a.pinned_by->state, ptr) != 0)
    HMC_LOG("core", warn, "{} could not unregister host memory before its free: {}", a.pinned_by->name,
            provider_error(*a.pinned_by));
  if (a.net) {
    if (int rc = a.net->net->mem_free(a.net->state, ptr, a.mr); rc != 0)
      HMC_LOG("core", warn, "freeing memory from {} failed (code {})", a.net->name, rc);
  } else if (a.provider->dev->mem_free(a.provider->state, device.index, ptr) != 0) {
    HMC_LOG("core", warn, "freeing memory on {} failed: {}", device.to_string(), provider_error(*a.provider));
  }
}

const std::pair<const uintptr_t, ContextImpl::Allocation>* ContextImpl::find_allocation(const void* ptr,
                                                                                       std::size_t bytes) const {
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations_.upper_bound(addr);
  if (it == allocations_.begin()) return nullptr;
  --it;
  return addr + bytes <= it->first + it->second.bytes ? &*it : nullptr;
}

ContextImpl::MemInfo ContextImpl::lookup(const void* ptr, std::size_t bytes) const {
  {
    std::lock_guard lock(mu_);
    if (const auto* found = find_allocation(ptr, std::max<std::size_t>(bytes, 1))) {
      const Allocation& a = found->second;
      return {a.provider, a.device, a.device_mem, a.id, a.kind, reinterpret_cast<const uint8_t*>(found->first), a.bytes, 0};
    }
  }
  return foreign(ptr);
}

ContextImpl::MemInfo ContextImpl::foreign(const void* ptr) const {
  for (LoadedProvider* p : queriers_) {
    int device = 0;
    void* base = nullptr;
    std::size_t bytes = 0;
    uint64_t id = 0;
    const int rc = p->dev->mem_query(p->state, ptr, &device, &base, &bytes, &id);
    if (rc == 0) return {p, device, true, 0, AllocKind::kDefault, static_cast<const uint8_t*>(base), bytes, id};
    // A failed query leaves the memory to the next provider, and in the end to the host:
    // said once as a warning (a driver that fails it fails it on every message), as device
    // memory taken for host memory faults when the CPU copies it.
    if (rc < 0) {
      static std::atomic<bool> said{false};
      const std::string text = fmt::format("{} could not say whether {} is its memory ({}); taken for host memory",
                                           p->name, ptr, provider_error(*p));
      if (!said.exchange(true)) HMC_LOG("core", warn, "{}", text);
      else HMC_LOG("core", debug, "{}", text);
    }
  }
  return {registry_->device("cpu"), 0, false, 0, AllocKind::kDefault, nullptr, 0, 0};
}

LoadedProvider* ContextImpl::provider_of(const void* ptr) const { return lookup(ptr, 1).provider; }

ContextImpl::MemInfo ContextImpl::mem_info(const void* ptr, std::size_t bytes) const { return lookup(ptr, bytes); }

bool ContextImpl::device_mem(const void* ptr, std::size_t bytes) const {
  // A pointer into device memory HMC allocated comes from an allocation that its caller
  // saw made, so its count is visible to that thread.
  if (device_allocs_.load(std::memory_order_relaxed) == 0 && queriers_.empty()) return false;
  return lookup(ptr, bytes).device_mem;
}

bool ContextImpl::owns(const void* ptr, std::size_t bytes) const {
  std::lock_guard lock(mu_);
  return find_allocation(ptr, bytes) != nullptr;
}

DeviceId ContextImpl::device_of(const void* ptr) const {
  const MemInfo m = lookup(ptr, 1);
  return {m.provider->name, m.device};
}

Status ContextImpl::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return {};
  if (!dst || !src) return {ErrorCode::kInvalidArgument, "copy with a null pointer"};
  LoadedProvider* pd = provider_of(dst);
  LoadedProvider* ps = provider_of(src);
  // A vendor provider copies host<->its device and within itself; cpu only host<->host.
  LoadedProvider* p = pd->name != "cpu" ? pd : ps;
  if (pd->name != "cpu" && ps->name != "cpu" && pd != ps)
    return {ErrorCode::kUnsupported, "copy between devices of two providers (" + pd->name + ", " + ps->name + ") needs host staging"};
  if (p != ps) pin_for(p, src, bytes);
  if (p != pd) pin_for(p, dst, bytes);
  if (p->dev->copy(p->state, dst, src, bytes, nullptr) != 0)
    return {ErrorCode::kInternal, "copy of " + std::to_string(bytes) + " bytes by " + p->name + " failed: " + provider_error(*p)};
  return {};
}

void ContextImpl::pin_for(LoadedProvider* by, const void* ptr, std::size_t bytes) {
  if (!(by->dev->caps & HMC_DEV_CAP_HOST_REGISTER) || host_register_min_ == 0 || bytes < host_register_min_) return;
  void* base = nullptr;
  std::size_t len = 0;
  {
    std::lock_guard lock(mu_);
    auto* found = const_cast<std::pair<const uintptr_t, Allocation>*>(find_allocation(ptr, bytes));
    if (!found) return;
    Allocation& a = found->second;
    if (a.device_mem || a.kind == AllocKind::kPinnedHost || a.pinned_by || a.pin_failed) return;
    a.pinned_by = by;  // claimed: a second caller leaves it alone
    base = reinterpret_cast<void*>(found->first);
    len = a.bytes;
  }
  if (by->dev->host_register(by->state, base, len) == 0) {
    HMC_LOG("core", debug, "{} bytes of host memory at {} registered with {}", len, base, by->name);
    return;
  }
  HMC_LOG("core", debug, "{} did not register {} bytes of host memory ({}); its copies run at pageable speed", by->name,
          len, provider_error(*by));
  std::lock_guard lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(base));
  if (it != allocations_.end()) {
    it->second.pinned_by = nullptr;
    it->second.pin_failed = true;
  }
}

Status ContextImpl::reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return {};
  LoadedProvider* p = provider_of(dst);
  if (!(p->dev->caps & HMC_DEV_CAP_REDUCE)) return {ErrorCode::kUnsupported, "provider " + p->name + " cannot reduce"};
  if (p->dev->reduce(p->state, dst, a, b, count, static_cast<int>(dtype), static_cast<int>(op), nullptr) != 0)
    return {ErrorCode::kInternal, "reduce on " + p->name + " failed: " + provider_error(*p)};
  return {};
}

Status ContextImpl::divide(void* buf, std::size_t count, DataType dtype, uint64_t divisor) {
  if (count == 0) return {};
  LoadedProvider* p = provider_of(buf);
  if (!(p->dev->caps & HMC_DEV_CAP_REDUCE)) return {ErrorCode::kUnsupported, "provider " + p->name + " cannot divide"};
  if (p->dev->divide(p->state, buf, count, static_cast<int>(dtype), divisor, nullptr) != 0)
    return {ErrorCode::kInternal, "divide on " + p->name + " failed: " + provider_error(*p)};
  return {};
}

Status ContextImpl::start_root(const std::string& host, uint16_t port, const Secret& secret) {
  // from_env again on the same port: this context's root of the job before holds it. Once
  // that job is over (its ranks finalizing or gone) it makes room; until then its ranks
  // that dial in for the next job are turned away and retry.
  std::vector<std::unique_ptr<BootstrapRoot>> same;
  {
    std::lock_guard lock(mu_);
    for (auto& r : roots_)
      if (r && port != 0 && r->port() == port) same.push_back(std::move(r));
    std::erase(roots_, nullptr);
  }
  const auto until = deadline();
  for (auto& r : same)
    if (r->wait_finished(until).ok()) r.reset();  // joins its thread, closes its port
  std::erase(same, nullptr);
  if (!same.empty()) {
    std::lock_guard lock(mu_);
    for (auto& r : same) roots_.push_back(std::move(r));
    return {ErrorCode::kUnavailable, "port " + std::to_string(port) + " is held by this process's bootstrap root of an "
                                     "earlier job that has not ended (finalize or abort it on every rank first)"};
  }
  auto root = BootstrapRoot::start(host, port, secret);
  if (!root) return root.status();
  keep_root(std::move(root.value()));
  return {};
}

// Roots of jobs that are over go when the next one comes: each holds a thread and its
// sockets, and a process that splits in a loop would otherwise run out of either.
void ContextImpl::keep_root(std::unique_ptr<BootstrapRoot> root) {
  std::vector<std::unique_ptr<BootstrapRoot>> over;
  {
    std::lock_guard lock(mu_);
    for (auto& r : roots_)
      if (r->over()) over.push_back(std::move(r));
    std::erase(roots_, nullptr);
    roots_.push_back(std::move(root));
  }
  over.clear();  // joins their threads, outside the lock
}

Result<UniqueId> ContextImpl::create_unique_id(const std::string& reachable_at) {
  UniqueId id;
  std::random_device rd;
  for (auto& b : id.secret) b = static_cast<uint8_t>(rd());
  std::string host = config_.str("HMC_BOOTSTRAP_ADDR");
  if (host.empty()) host = reachable_at;
  if (host.empty()) host = hostname_ipv4();
  auto root = BootstrapRoot::start(root_bind_host(host), 0, id.secret);
  if (!root) return root.status();
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  id.root = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(root.value()->port());
  keep_root(std::move(root.value()));
  return id;
}

namespace {
// The CPUs this process may run on (a launcher that binds each rank to one core leaves one).
int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}
}  // namespace

void ContextImpl::note_host_ranks(int n, bool helpers) {
  constexpr int kAlone = 8;  // polls between yields with a CPU to oneself (progress.h)
  std::lock_guard lock(mu_);
  host_ranks_ = std::max(host_ranks_, n);
  host_helpers_ = host_helpers_ || helpers;
  const auto cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int segments = yield_every_ > 0 ? static_cast<int>(yield_every_) : host_ranks_ <= cpus ? kAlone : 1;
  // Where messages need a provider's helper thread to run beside the rank: a CPU for
  // each, on the host and within this rank's own binding.
  const bool room = host_helpers_ ? 2 * host_ranks_ <= cpus && allowed_cpus() >= 2 : host_ranks_ <= cpus;
  const int messages = yield_every_ > 0 ? static_cast<int>(yield_every_) : room ? kAlone : 1;
  engine_->set_yield_every(segments);
  engine_->set_message_yield_every(messages);
}

}  // namespace hmc::core
