// Catch-free half of the net kit harness: settings, the host services lent to
// plugins, sessions and test data. Shared by hmc-conformance-net and
// hmc-conformance-net-bw.
#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "net_kit.h"
#include "param_defaults.h"

namespace hmc_conformance {

namespace {

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : fallback;
}

void host_log(void*, int level, const char* provider, const char* message) {
  static const bool verbose = std::strcmp(env_or("HMC_CONFORMANCE_VERBOSE", "0"), "1") == 0;
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error"};
  if (level < HMC_LOG_INFO && !verbose) return;
  const char* name = level >= 0 && level <= HMC_LOG_ERROR ? kNames[level] : "?";
  std::fprintf(stderr, "[%s] %s: %s\n", name, provider ? provider : "?", message ? message : "");
}

int host_config_get(void* host, const char* name, char* value, size_t value_len) {
  const auto& config = static_cast<TestHost*>(host)->config;
  const auto it = config.find(name);
  if (it == config.end()) return 1;
  if (it->second.size() + 1 > value_len) return -1;
  std::memcpy(value, it->second.c_str(), it->second.size() + 1);
  return 0;
}

void host_wake(void* host) {
  auto* h = static_cast<TestHost*>(host);
  h->wakes.fetch_add(1);
  if (h->sleepers.load() == 0) return;
  std::lock_guard lock(h->mu);
  h->cv.notify_all();
}

}  // namespace

std::chrono::milliseconds timeout() {
  static const auto t = std::chrono::milliseconds(
      static_cast<long>(1000 * std::atof(env_or("HMC_CONFORMANCE_TIMEOUT", "10"))));
  return t;
}

uint64_t seed() {
  static const uint64_t s = [] {
    const char* v = std::getenv("HMC_CONFORMANCE_SEED");
    return v != nullptr ? std::strtoull(v, nullptr, 0) : std::random_device{}();
  }();
  return s;
}

std::vector<std::string> plugin_paths() {
  std::vector<std::string> out;
  const char* list = std::getenv("HMC_CONFORMANCE_NET_PLUGIN");
  if (list == nullptr || list[0] == '\0') list = std::getenv("HMC_CONFORMANCE_PLUGIN");
  if (list != nullptr && list[0] != '\0') {
    std::stringstream ss(list);
    for (std::string p; std::getline(ss, p, ':');) {
      if (!p.empty()) out.push_back(p);
    }
    return out;
  }
  glob_t g{};
  const std::string pattern = std::string(HMC_CONFORMANCE_PLUGIN_DIR) + "/libhmc-net-*.so";
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

std::string file_provider_name(const std::string& path) {
  const std::string base = path.substr(path.find_last_of('/') + 1);
  const std::string prefix = "libhmc-net-";
  if (base.rfind(prefix, 0) != 0 || base.size() < prefix.size() + 4 ||
      base.compare(base.size() - 3, 3, ".so") != 0) {
    return {};
  }
  return base.substr(prefix.size(), base.size() - prefix.size() - 3);
}

Config env_config() { return hmc::conformance::environment_settings(); }

bool Session::open(const std::string& plugin, Config config) {
  path = plugin;
  host_.config = std::move(config);
  dl_ = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl_ == nullptr) {
    reason = std::string("dlopen: ") + dlerror();
    return false;
  }
  auto entry = reinterpret_cast<hmc_net_entry_v1_fn>(dlsym(dl_, HMC_NET_ENTRY_V1));
  p = entry != nullptr ? entry() : nullptr;
  // Tables as short as the first v1 table load; appended functions are used only when present.
  if (p == nullptr || p->struct_size < offsetof(hmc_net_provider_t, mem_alloc) ||
      p->abi_version != HMC_NET_ABI_VERSION || p->init == nullptr) {
    reason = "no valid " HMC_NET_ENTRY_V1 " table";
    p = nullptr;
    return false;
  }
  // Parameters of the first v1 tables are there in every table the check above passed.
  hmc::conformance::add_param_defaults(host_.config, p->params, p->num_params);
  services_ = {sizeof(hmc_host_services_t), &host_, host_log, host_config_get, host_wake};
  char text[512] = {};
  init_rc = p->init(&services_, &state, text, sizeof(text));
  reason = text;
  if (init_rc != HMC_PROV_OK) state = nullptr;
  return init_rc == HMC_PROV_OK;
}

void Session::close() {
  if (partner != nullptr && partner->partner == this) partner->partner = nullptr;
  partner = nullptr;
  if (p != nullptr && init_rc == HMC_PROV_OK) p->fini(state);  // as libhmc: whatever state holds
  init_rc = HMC_PROV_ERR_INTERNAL;  // once
  state = nullptr;
  if (dl_ != nullptr) dlclose(dl_);
  dl_ = nullptr;
  p = nullptr;
}

void Session::progress() {
  p->progress(state);
  if (partner != nullptr && partner->state != nullptr) partner->p->progress(partner->state);
}

void Session::nap(std::chrono::milliseconds limit) {
  const uint64_t seen = host_.wakes.load();
  host_.sleep(limit, [&](uint64_t now) { return now != seen; });
}

uint64_t Session::wakes() { return host_.wakes.load(); }

uint64_t Session::wakes_past(uint64_t seen, std::chrono::milliseconds limit) {
  host_.sleep(limit, [&](uint64_t now) { return now > seen; });
  return host_.wakes.load();
}

Outcome Session::wait(void* req, std::chrono::milliseconds limit, int spins) {
  Outcome out;
  const auto deadline = Clock::now() + limit;
  char message[512];
  // 64 bits: a busy poll of 60 s at tens of ns a round passes 2^31 rounds.
  for (uint64_t round = 0;; ++round) {
    // The wake count from before the test: a wake after it cuts the sleep short. A busy
    // poll never sleeps, and reads the clock every 256th round: it stands for a host's
    // tightest loop (hmc-conformance-net-bw ... spin), so it costs what such a loop costs.
    const uint64_t seen = spins == kBusyPoll ? 0 : host_.wakes.load();
    int done = 0;
    message[0] = 0;
    out.rc = p->test(state, req, &done, &out.bytes, message, sizeof(message));
    out.done = done != 0;
    if (out.rc != HMC_PROV_OK || out.done) {
      out.message.assign(message, strnlen(message, sizeof(message)));
      return out;
    }
    if ((spins != kBusyPoll || round % 256 == 0) && Clock::now() >= deadline) {
      out.timed_out = true;
      return out;
    }
    progress();
    if (spins == kBusyPoll) continue;
    if (spins > 0 && round < static_cast<uint64_t>(spins)) {
      std::this_thread::yield();
      continue;
    }
    host_.sleep(std::chrono::milliseconds(20), [&](uint64_t now) { return now != seen; });
  }
}

void* Session::accept(void* listener, std::vector<char>* hello, bool keep) {
  const auto deadline = Clock::now() + timeout();
  std::vector<char> buf(HMC_NET_HELLO_MAX);
  while (Clock::now() < deadline) {
    void* conn = nullptr;
    size_t len = 0;
    int rc = p->accept(state, listener, &conn, buf.data(), buf.size(), &len);
    if (rc == HMC_PROV_OK) {
      if (hello != nullptr) hello->assign(buf.begin(), buf.begin() + static_cast<long>(len));
      if (keep && wait_connected(conn) != HMC_PROV_OK) {
        p->close_conn(state, conn);
        return nullptr;
      }
      return conn;
    }
    if (rc < 0) return nullptr;
    progress();
    nap(std::chrono::milliseconds(5));
  }
  return nullptr;
}

int Session::wait_connected(void* conn) {
  const auto deadline = Clock::now() + timeout();
  int rc = p->conn_status(state, conn);
  while (rc == HMC_PROV_IN_PROGRESS && Clock::now() < deadline) {
    progress();
    nap(std::chrono::milliseconds(5));
    rc = p->conn_status(state, conn);
  }
  return rc;
}

SharedMem::SharedMem(size_t len, unsigned char fill, bool sealed) : len_(len) {
  fd_ = memfd_create("hmc-conformance", MFD_CLOEXEC | (sealed ? MFD_ALLOW_SEALING : 0));
  if (fd_ < 0) {
    error_ = std::string("memfd_create: ") + std::strerror(errno);
    return;
  }
  const size_t map_len = len > 0 ? len : 1;
  if (ftruncate(fd_, static_cast<off_t>(map_len)) != 0) {
    error_ = std::string("ftruncate: ") + std::strerror(errno);
    return;
  }
  if (sealed && fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    error_ = std::string("F_ADD_SEALS: ") + std::strerror(errno);
    return;
  }
  void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    error_ = std::string("mmap: ") + std::strerror(errno);
    return;
  }
  data_ = static_cast<char*>(p);
  std::memset(data_, fill, map_len);
}

SharedMem::~SharedMem() {
  if (data_ != nullptr) munmap(data_, len_ > 0 ? len_ : 1);
  close_fd();
}

void SharedMem::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void fill_random(char* p, size_t n, uint64_t salt) {
  std::mt19937_64 rng(seed() * 0x9e3779b97f4a7c15ull + salt);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, n - i);
  }
}

std::vector<char> random_bytes(size_t n, uint64_t salt) {
  std::vector<char> v(n);
  fill_random(v.data(), n, salt);
  return v;
}

size_t first_not(const char* p, size_t n, unsigned char value) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(p[i]) != value) return i;
  }
  return n;
}

size_t first_diff(const char* a, const char* b, size_t n) {
  if (n == 0 || std::memcmp(a, b, n) == 0) return n;
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return n;
}

}  // namespace hmc_conformance
