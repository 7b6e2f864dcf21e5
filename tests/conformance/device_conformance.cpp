// hmc-conformance-device: the kit a vendor runs on a device provider plugin.
//
// It dlopens each plugin (HMC_CONFORMANCE_DEVICE_PLUGIN=path[:path...], default every
// libhmc-device-*.so in the build's lib folder), lends it minimal host services and
// checks the ABI contract of include/hmc/provider/device.h: the table, init, devices,
// memory, copy, reduce/divide against references computed here, streams/events, IPC
// between two processes, and that bad arguments give an error instead of a crash.
// A plugin whose init says HMC_PROV_ERR_UNAVAILABLE is reported and skipped.
//
// Environment: HMC_CONFORMANCE_SEED (random seed, printed), HMC_CONFORMANCE_TIMEOUT
// (seconds per wait, default 30), HMC_CONFORMANCE_STRICT=1 (floats must be correctly
// rounded, bit for bit, instead of within one ulp), HMC_CONFORMANCE_VERBOSE=1 (print
// the plugin's debug log), HMC_CONFORMANCE_LARGE (elements of the large-count reduce
// check; 0 skips it), HMC_CONFORMANCE_REQUIRE_AVAILABLE=1 (exit 77, CTest's skip, with
// the reason when a plugin is unavailable: the hardware-labelled runs); other HMC_*
// variables reach the plugin as its parameters (e.g. HMC_CPU_SIMD=baseline). Provider
// memory is only ever touched through the plugin's copy (device pointers are never
// dereferenced). The program re-executes itself with --hmc-ipc-child to play the
// exporting process: vendor runtimes do not survive a plain fork.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch_run.h"
#include "hmc/provider/device.h"
#include "param_defaults.h"
#include "param_rules.h"

extern char** environ;

// The first v1 tables ended before the stream flags' functions; the loader still takes
// them (core/plugin_registry.cpp), so the kit does too.
constexpr std::size_t kFirstV1Size = offsetof(hmc_device_provider_t, flag_alloc);

namespace {

using Clock = std::chrono::steady_clock;

// ---- settings --------------------------------------------------------------------

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : fallback;
}

std::chrono::milliseconds timeout() {
  static const auto t = std::chrono::milliseconds(
      static_cast<long>(1000 * std::atof(env_or("HMC_CONFORMANCE_TIMEOUT", "30"))));
  return t;
}

bool strict() { return std::strcmp(env_or("HMC_CONFORMANCE_STRICT", "0"), "1") == 0; }

uint64_t seed() {
  static const uint64_t s = [] {
    const char* v = std::getenv("HMC_CONFORMANCE_SEED");
    return v != nullptr ? std::strtoull(v, nullptr, 0) : std::random_device{}();
  }();
  return s;
}

std::vector<std::string> plugin_paths() {
  std::vector<std::string> out;
  if (const char* list = std::getenv("HMC_CONFORMANCE_DEVICE_PLUGIN"); list && list[0]) {
    std::stringstream ss(list);
    for (std::string p; std::getline(ss, p, ':');) {
      if (!p.empty()) out.push_back(p);
    }
    return out;
  }
  glob_t g{};
  const std::string pattern = std::string(HMC_CONFORMANCE_PLUGIN_DIR) + "/libhmc-device-*.so";
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

// "" when equal, else where they first differ: a CHECK then prints a line, not megabytes.
std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  }
  const auto m = std::mismatch(got.begin(), got.end(), want.begin());
  if (m.first == got.end()) return {};
  return "byte " + std::to_string(m.first - got.begin()) + ": got " + std::to_string(*m.first) +
         ", want " + std::to_string(*m.second);
}

// ---- host services lent to the plugin ------------------------------------------------

struct Host {
  std::map<std::string, std::string> config;
};

void host_log(void*, int level, const char* provider, const char* message) {
  static const bool verbose = std::strcmp(env_or("HMC_CONFORMANCE_VERBOSE", "0"), "1") == 0;
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error"};
  if (level < HMC_LOG_INFO && !verbose) return;
  const char* name = level >= 0 && level <= HMC_LOG_ERROR ? kNames[level] : "?";
  std::fprintf(stderr, "[%s] %s: %s\n", name, provider ? provider : "?", message ? message : "");
}

int host_config_get(void* host, const char* name, char* value, size_t value_len) {
  const auto& config = static_cast<Host*>(host)->config;
  const auto it = config.find(name);
  if (it == config.end()) return 1;
  if (it->second.size() + 1 > value_len) return -1;
  std::memcpy(value, it->second.c_str(), it->second.size() + 1);
  return 0;
}

void host_wake(void*) {}

// ---- one loaded, initialised plugin ---------------------------------------------------

std::string file_provider_name(const std::string& path) {
  const std::string base = path.substr(path.find_last_of('/') + 1);
  const std::string prefix = "libhmc-device-";
  if (base.rfind(prefix, 0) != 0 || base.size() < prefix.size() + 4 ||
      base.compare(base.size() - 3, 3, ".so") != 0) {
    return {};
  }
  return base.substr(prefix.size(), base.size() - prefix.size() - 3);
}

class Session {
 public:
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() { close(); }

  // Loads and initialises; Catch REQUIREs fail the test on a broken plugin.
  void open(const std::string& path, const std::map<std::string, std::string>& config = {}) {
    path_ = path;
    host_.config = hmc::conformance::environment_settings();
    for (const auto& [name, value] : config) host_.config[name] = value;
    dl_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    INFO("dlopen " << path << ": " << (dl_ ? "ok" : dlerror()));
    REQUIRE(dl_ != nullptr);
    auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl_, HMC_DEVICE_ENTRY_V1));
    INFO("entry symbol " HMC_DEVICE_ENTRY_V1);
    REQUIRE(entry != nullptr);
    p = entry();
    REQUIRE(p != nullptr);
    REQUIRE(p->struct_size >= kFirstV1Size);
    REQUIRE(p->abi_version == HMC_DEVICE_ABI_VERSION);
    REQUIRE(p->init != nullptr);
    hmc::conformance::add_param_defaults(host_.config, p->params, p->num_params);
    services_ = {sizeof(hmc_host_services_t), &host_, host_log, host_config_get, host_wake};
    char reason[512];
    std::memset(reason, 0, sizeof(reason));
    init_rc = p->init(&services_, &state, reason, sizeof(reason));
    this->reason = reason;
    if (init_rc != HMC_PROV_OK) state = nullptr;
  }

  bool ready() const { return p != nullptr && init_rc == HMC_PROV_OK; }
  // A capability whose functions were appended counts only if the table holds them (the
  // loader takes tables as short as the first v1 ones, which end before flag_alloc).
  bool has(uint64_t cap) const {
    if ((p->caps & cap) == 0) return false;
    auto holds = [&](std::size_t end) { return p->struct_size >= end + sizeof(void*); };
    if (cap == HMC_DEV_CAP_STREAM_FLAGS) return holds(offsetof(hmc_device_provider_t, stream_wait_flag));
    if (cap == HMC_DEV_CAP_HOST_REGISTER) return holds(offsetof(hmc_device_provider_t, host_unregister));
    if (cap == HMC_DEV_CAP_MEM_QUERY) return holds(offsetof(hmc_device_provider_t, mem_query));
    if (cap == HMC_DEV_CAP_IPC_EXTENT) return holds(offsetof(hmc_device_provider_t, ipc_extent));
    return true;
  }
  std::string error() const {
    const char* e = p->last_error ? p->last_error(state) : nullptr;
    return e ? e : "(null last_error)";
  }
  const std::string& path() const { return path_; }

  void close() {
    if (p != nullptr && init_rc == HMC_PROV_OK) p->fini(state);  // as libhmc: whatever state holds
    init_rc = HMC_PROV_ERR_INTERNAL;  // once
    state = nullptr;
    if (dl_ != nullptr) dlclose(dl_);
    dl_ = nullptr;
    p = nullptr;
  }

  const hmc_device_provider_t* p = nullptr;
  void* state = nullptr;
  int init_rc = HMC_PROV_ERR_INTERNAL;
  std::string reason;

 private:
  std::string path_;
  void* dl_ = nullptr;
  Host host_;
  hmc_host_services_t services_{};
};

// Runs `body` once per plugin, each in its own section; unavailable plugins are skipped.
void for_each_plugin(const std::function<void(Session&)>& body) {
  const auto paths = plugin_paths();
  if (paths.empty()) {
    FAIL("no plugin found: set HMC_CONFORMANCE_DEVICE_PLUGIN or build one into "
         << HMC_CONFORMANCE_PLUGIN_DIR);
  }
  for (const auto& path : paths) {
    DYNAMIC_SECTION(path) {
      Session s;
      s.open(path);
      if (s.init_rc == HMC_PROV_ERR_UNAVAILABLE) {
        WARN(path << " is unavailable here (" << s.reason << "): skipped");
        CHECK_FALSE(s.reason.empty());
      } else {
        INFO("init returned " << s.init_rc << ": " << s.reason);
        REQUIRE(s.init_rc == HMC_PROV_OK);
        body(s);
      }
    }
  }
}

// Waits for an event with a deadline; false on timeout.
bool wait_event(Session& s, void* event) {
  const auto deadline = Clock::now() + timeout();
  for (;;) {
    const int rc = s.p->event_query(s.state, event);
    if (rc == HMC_PROV_OK) return true;
    INFO("event_query: " << rc << " " << (rc < 0 ? s.error() : ""));
    REQUIRE(rc == HMC_PROV_IN_PROGRESS);
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Makes work queued on `stream` complete (nothing to do for the synchronous NULL stream).
void sync_stream(Session& s, void* stream) {
  if (stream == nullptr) return;
  void* event = nullptr;
  REQUIRE(s.p->event_create(s.state, 0, &event) == 0);
  REQUIRE(s.p->event_record(s.state, event, stream) == 0);
  const bool done = wait_event(s, event);
  s.p->event_destroy(s.state, event);
  INFO("event on stream did not complete within the deadline");
  REQUIRE(done);
}

// ---- memory the provider computes on -------------------------------------------------

// Device memory when the provider has it, else its pinned host memory, else plain
// host memory: the kind a collective would hand to copy and reduce.
struct Buffer {
  Session* s = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  bool from_provider = false;

  Buffer(Session& session, size_t n) : s(&session), bytes(n) {
    int kind = -1;
    if (s->has(HMC_DEV_CAP_DEVICE_MEM)) kind = HMC_ALLOC_DEVICE;
    else if (s->has(HMC_DEV_CAP_PINNED_HOST)) kind = HMC_ALLOC_PINNED_HOST;
    if (kind >= 0) {
      const int rc = s->p->mem_alloc(s->state, 0, n, kind, &ptr);
      INFO("mem_alloc(" << n << ", kind " << kind << "): " << rc << " " << (rc ? s->error() : ""));
      REQUIRE(rc == 0);
      from_provider = true;
    } else {
      ptr = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
      REQUIRE(ptr != nullptr);
    }
  }
  ~Buffer() {
    if (from_provider) s->p->mem_free(s->state, 0, ptr);
    else std::free(ptr);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void write(const void* src, size_t n, size_t offset = 0) {
    const int rc = s->p->copy(s->state, static_cast<char*>(ptr) + offset, src, n, nullptr);
    INFO("copy to provider memory: " << rc << " " << (rc ? s->error() : ""));
    REQUIRE(rc == 0);
  }
  std::vector<uint8_t> read(size_t n) const {
    std::vector<uint8_t> out(n, 0x5a);
    const int rc = s->p->copy(s->state, out.data(), ptr, n, nullptr);
    INFO("copy from provider memory: " << rc << " " << (rc ? s->error() : ""));
    REQUIRE(rc == 0);
    return out;
  }
  void poison(uint8_t value = 0xa5) {
    std::vector<uint8_t> p(bytes, value);
    write(p.data(), bytes);
  }
};

// ---- reference numerics, independent of any provider's code --------------------------

struct Dtype {
  int id;
  const char* name;
  size_t size;
  bool is_float;
  bool is_signed;
  int mant_bits;  // explicit significand bits (floats)
  int emin;       // exponent of the smallest normal (floats)
};

constexpr Dtype kDtypes[] = {
    {HMC_DTYPE_INT8, "int8", 1, false, true, 0, 0},
    {HMC_DTYPE_UINT8, "uint8", 1, false, false, 0, 0},
    {HMC_DTYPE_INT32, "int32", 4, false, true, 0, 0},
    {HMC_DTYPE_UINT32, "uint32", 4, false, false, 0, 0},
    {HMC_DTYPE_INT64, "int64", 8, false, true, 0, 0},
    {HMC_DTYPE_UINT64, "uint64", 8, false, false, 0, 0},
    {HMC_DTYPE_FP16, "fp16", 2, true, true, 10, -14},
    {HMC_DTYPE_BF16, "bf16", 2, true, true, 7, -126},
    {HMC_DTYPE_FP32, "fp32", 4, true, true, 23, -126},
    {HMC_DTYPE_FP64, "fp64", 8, true, true, 52, -1022},
};
constexpr const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};

uint64_t mask_of(const Dtype& t) { return t.size == 8 ? ~0ull : (1ull << (8 * t.size)) - 1; }

uint64_t load(const Dtype& t, const uint8_t* base, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, base + i * t.size, t.size);  // little-endian hosts
  return v;
}
void store(const Dtype& t, uint8_t* base, size_t i, uint64_t v) {
  std::memcpy(base + i * t.size, &v, t.size);
}

// Narrow formats (fp16: 5-bit exponent, bf16: 8-bit) decoded by their definition.
double decode_narrow(uint64_t bits, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint64_t m = bits & ((1ull << mant_bits) - 1);
  const int e = static_cast<int>((bits >> mant_bits) & ((1u << exp_bits) - 1));
  const bool neg = (bits >> (exp_bits + mant_bits)) & 1;
  double v;
  if (e == (1 << exp_bits) - 1) v = m ? std::nan("") : INFINITY;
  else if (e == 0) v = std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  else v = std::ldexp(static_cast<double>(m + (1ull << mant_bits)), e - bias - mant_bits);
  return neg ? -v : v;
}

// Rounds x to the nearest value of a format with `mant_bits` explicit bits and smallest
// normal exponent `emin`, ties to even; returns the rounded value (inf on overflow).
double round_narrow(double x, int mant_bits, int emin, int emax) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exp - mant_bits);
  const double r = std::nearbyint(std::fabs(x) / quantum) * quantum;  // exact scaling
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, -mant_bits), emax);
  const double v = r > largest ? INFINITY : r;
  return std::signbit(x) ? -v : v;
}

uint64_t encode_narrow(double v, int exp_bits, int mant_bits) {
  const uint64_t sign = std::signbit(v) ? 1ull << (exp_bits + mant_bits) : 0;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint64_t inf = ((1ull << exp_bits) - 1) << mant_bits;
  if (std::isnan(v)) return sign | inf | (1ull << (mant_bits - 1));
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | inf;
  if (a < std::ldexp(1.0, 1 - bias)) {  // subnormal or zero
    return sign | static_cast<uint64_t>(std::ldexp(a, bias - 1 + mant_bits));
  }
  int e = 0;
  std::frexp(a, &e);
  const uint64_t m = static_cast<uint64_t>(std::ldexp(a, mant_bits - (e - 1))) - (1ull << mant_bits);
  return sign | (static_cast<uint64_t>(e - 1 + bias) << mant_bits) | m;
}

double to_double(const Dtype& t, uint64_t bits) {
  switch (t.id) {
    case HMC_DTYPE_FP16: return decode_narrow(bits, 5, 10);
    case HMC_DTYPE_BF16: return decode_narrow(bits, 8, 7);
    case HMC_DTYPE_FP32: return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case HMC_DTYPE_FP64: return std::bit_cast<double>(bits);
  }
  return 0;
}

// Correctly rounded conversion of a double to the float dtype (fp32 by the hardware).
uint64_t from_double(const Dtype& t, double v) {
  switch (t.id) {
    case HMC_DTYPE_FP16: return encode_narrow(round_narrow(v, 10, -14, 15), 5, 10);
    case HMC_DTYPE_BF16: return encode_narrow(round_narrow(v, 7, -126, 127), 8, 7);
    case HMC_DTYPE_FP32: return std::bit_cast<uint32_t>(static_cast<float>(v));
    case HMC_DTYPE_FP64: return std::bit_cast<uint64_t>(v);
  }
  return 0;
}

int64_t as_signed(const Dtype& t, uint64_t bits) {
  const int shift = 64 - 8 * static_cast<int>(t.size);
  return static_cast<int64_t>(bits << shift) >> shift;
}

// The reference result of one element: integers wrap, floats are computed exactly or
// with >= 2p+2 bits in double (so one final rounding is correct) and NaN propagates
// through min and max.
uint64_t ref_op(const Dtype& t, int op, uint64_t a, uint64_t b) {
  if (!t.is_float) {
    uint64_t r = 0;
    const bool a_lt_b = t.is_signed ? as_signed(t, a) < as_signed(t, b) : a < b;
    switch (op) {
      case HMC_OP_SUM:
      case HMC_OP_AVG: r = a + b; break;
      case HMC_OP_PROD: r = a * b; break;  // the low bits of a product ignore the sign
      case HMC_OP_MIN: r = a_lt_b ? a : b; break;
      case HMC_OP_MAX: r = a_lt_b ? b : a; break;
    }
    return r & mask_of(t);
  }
  const double x = to_double(t, a);
  const double y = to_double(t, b);
  double r = 0;
  switch (op) {
    case HMC_OP_SUM:
    case HMC_OP_AVG: r = x + y; break;
    case HMC_OP_PROD: r = x * y; break;
    // Equal values (-0 and +0) give b; only the strict mode looks at the sign of zero.
    case HMC_OP_MIN: r = std::isnan(x) || std::isnan(y) ? NAN : (x < y ? x : y); break;
    case HMC_OP_MAX: r = std::isnan(x) || std::isnan(y) ? NAN : (x > y ? x : y); break;
  }
  return from_double(t, r);
}

uint64_t ref_divide(const Dtype& t, uint64_t x, uint64_t d) {
  if (!t.is_float) {
    if (!t.is_signed) return (x / d) & mask_of(t);
    const __int128 q = static_cast<__int128>(as_signed(t, x)) / static_cast<__int128>(d);
    return static_cast<uint64_t>(q) & mask_of(t);
  }
  return from_double(t, to_double(t, x) / static_cast<double>(d));
}

enum class Verdict { kExact, kClose, kWrong };

// Integers must match; floats match bit for bit, or (kClose) within one ulp of the
// dtype or below its smallest normal (a provider that flushes subnormals).
Verdict compare(const Dtype& t, uint64_t got, uint64_t want) {
  if (got == want) return Verdict::kExact;
  if (!t.is_float) return Verdict::kWrong;
  const double g = to_double(t, got);
  const double w = to_double(t, want);
  if (std::isnan(w) || std::isnan(g)) return std::isnan(w) && std::isnan(g) ? Verdict::kExact : Verdict::kWrong;
  if (g == w) return Verdict::kClose;  // +0 against -0
  if (std::isinf(g) || std::isinf(w)) return Verdict::kWrong;
  const double diff = std::fabs(g - w);
  if (diff <= std::ldexp(std::fabs(w), -t.mant_bits) || diff <= std::ldexp(1.0, t.emin)) {
    return Verdict::kClose;
  }
  return Verdict::kWrong;
}

std::string show(const Dtype& t, uint64_t bits) {
  std::ostringstream os;
  if (t.is_float) os << to_double(t, bits) << " (0x" << std::hex << bits << ")";
  else if (t.is_signed) os << as_signed(t, bits);
  else os << bits;
  return os.str();
}

// Counts mismatches and keeps the first, for one CHECK per batch of elements.
struct Tally {
  size_t wrong = 0;
  size_t close = 0;
  std::string first;
  void add(const Dtype& t, size_t i, uint64_t got, uint64_t want, const std::string& what) {
    const Verdict v = compare(t, got, want);
    if (v == Verdict::kExact) return;
    if (v == Verdict::kClose && !strict()) {
      ++close;
      return;
    }
    if (wrong++ == 0) {
      first = what + " [" + std::to_string(i) + "]: got " + show(t, got) + ", want " + show(t, want);
    }
  }
};

// Random inputs: integers use every bit; floats mix moderate values (realistic data)
// with random finite bit patterns (extremes, subnormals, overflow of products).
uint64_t random_element(const Dtype& t, std::mt19937_64& rng) {
  if (!t.is_float) return rng() & mask_of(t);
  if (rng() % 4 != 0) {
    std::uniform_real_distribution<double> u(-8.0, 8.0);
    return from_double(t, u(rng));
  }
  for (;;) {
    const uint64_t bits = rng() & mask_of(t);
    if (!std::isnan(to_double(t, bits)) && !std::isinf(to_double(t, bits))) return bits;
  }
}

std::vector<uint8_t> random_array(const Dtype& t, size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n * t.size);
  for (size_t i = 0; i < n; ++i) store(t, v.data(), i, random_element(t, rng));
  return v;
}

void report(const Tally& tally, const std::string& what) {
  if (tally.close > 0) {
    WARN(what << ": " << tally.close << " results within one ulp but not correctly rounded");
  }
  INFO(what << ": " << tally.wrong << " wrong results; first " << tally.first);
  CHECK(tally.wrong == 0);
}

}  // namespace

// ---- the table and init ----------------------------------------------------------------

TEST_CASE("the provider table is well formed", "[conformance][table]") {
  const auto paths = plugin_paths();
  REQUIRE_FALSE(paths.empty());
  for (const auto& path : paths) {
    DYNAMIC_SECTION(path) {
      void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      INFO("dlopen: " << (dl ? "ok" : dlerror()));
      REQUIRE(dl != nullptr);
      auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl, HMC_DEVICE_ENTRY_V1));
      const hmc_device_provider_t* p = entry ? entry() : nullptr;
      CHECK(p != nullptr);
      if (p != nullptr) {
        CHECK(p->abi_version == HMC_DEVICE_ABI_VERSION);
        CHECK(p->struct_size >= kFirstV1Size);  // what the loader takes
        REQUIRE(p->name != nullptr);
        CHECK(std::strlen(p->name) > 0);
        const std::string file_name = file_provider_name(path);
        if (!file_name.empty()) CHECK(file_name == p->name);
        // Mandatory entries, then every capability bit against the functions it promises.
        CHECK((p->init && p->fini && p->last_error && p->device_count && p->device_info &&
               p->mem_alloc && p->mem_free && p->copy));
        constexpr uint64_t kKnown = (HMC_DEV_CAP_IPC_EXTENT << 1) - 1;
        CHECK((p->caps & ~kKnown) == 0);
        if (p->caps & HMC_DEV_CAP_STREAMS) {
          CHECK((p->stream_create && p->stream_destroy && p->stream_query && p->event_create &&
                 p->event_destroy && p->event_record && p->stream_wait_event && p->event_query));
        }
        if (p->caps & HMC_DEV_CAP_REDUCE) CHECK((p->reduce && p->divide));
        if (p->caps & (HMC_DEV_CAP_IPC | HMC_DEV_CAP_SHAREABLE)) {
          CHECK((p->ipc_export && p->ipc_import && p->ipc_close));
          INFO("SHAREABLE memory exists to be exported with IPC: set both bits or neither");
          CHECK(bool(p->caps & HMC_DEV_CAP_IPC) == bool(p->caps & HMC_DEV_CAP_SHAREABLE));
        }
        if (p->caps & HMC_DEV_CAP_DMABUF) CHECK(p->dmabuf_export != nullptr);
        if (p->caps & HMC_DEV_CAP_PEER_ACCESS) CHECK(p->peer_access != nullptr);
        if (p->caps & HMC_DEV_CAP_STREAM_FLAGS) {  // appended: the table must reach that far
          INFO("STREAM_FLAGS is set, so the table must include the appended flag functions");
          REQUIRE(p->struct_size >= offsetof(hmc_device_provider_t, stream_wait_flag) + sizeof(void*));
          CHECK((p->flag_alloc && p->flag_free && p->stream_wait_flag));
          CHECK((p->caps & HMC_DEV_CAP_STREAMS) != 0);
        }
        if (p->caps & HMC_DEV_CAP_HOST_REGISTER) {  // appended after the flags
          INFO("HOST_REGISTER is set, so the table must include host_register/host_unregister");
          REQUIRE(p->struct_size >= offsetof(hmc_device_provider_t, host_unregister) + sizeof(void*));
          CHECK((p->host_register && p->host_unregister));
        }
        if (p->caps & HMC_DEV_CAP_MEM_QUERY) {  // appended after host registration
          INFO("MEM_QUERY is set, so the table must include mem_query");
          REQUIRE(p->struct_size >= offsetof(hmc_device_provider_t, mem_query) + sizeof(void*));
          CHECK(p->mem_query != nullptr);
        }
        if (p->caps & HMC_DEV_CAP_IPC_EXTENT) {  // appended after mem_query
          INFO("IPC_EXTENT is set, so the table must include ipc_extent, and IPC is set too");
          REQUIRE(p->struct_size >= offsetof(hmc_device_provider_t, ipc_extent) + sizeof(void*));
          CHECK(p->ipc_extent != nullptr);
          CHECK((p->caps & HMC_DEV_CAP_IPC) != 0);
        }
        // Parameters: HMC_<NAME>_*, typed, documented, each listed once, defaults that parse.
        hmc::conformance::check_params(p->name, p->params, p->num_params);
      }
      dlclose(dl);
    }
  }
}

TEST_CASE("init succeeds or says why not, and refuses malformed parameters",
          "[conformance][init]") {
  for_each_plugin([](Session& s) {
    for (size_t i = 0; s.p->params != nullptr && i < s.p->num_params; ++i) {
      const hmc_param_t& q = s.p->params[i];
      if (q.name == nullptr || q.type == nullptr) continue;  // the table test reports it
      const std::string type = q.type;
      if (type == "string") continue;
      DYNAMIC_SECTION("malformed " << q.name) {
        Session bad;
        bad.open(s.path(), {{q.name, "not-a-" + type + "!"}});
        INFO(q.name << "=not-a-" << type << "! was accepted");
        CHECK(bad.init_rc < 0);
        CHECK_FALSE(bad.reason.empty());
      }
    }
    // Two instances at once are independent (built-in and plugin may coexist).
    Session second;
    second.open(s.path());
    CHECK(second.init_rc == HMC_PROV_OK);
  });
}

TEST_CASE("devices are enumerated and described", "[conformance][devices]") {
  for_each_plugin([](Session& s) {
    int count = -1;
    REQUIRE(s.p->device_count(s.state, &count) == 0);
    INFO("init succeeded with no device: return HMC_PROV_ERR_UNAVAILABLE from init instead");
    REQUIRE(count >= 1);
    for (int d = 0; d < count; ++d) {
      hmc_device_info_t info;
      std::memset(&info, 0x5a, sizeof(info));
      info.struct_size = sizeof(info);
      const int rc = s.p->device_info(s.state, d, &info);
      INFO("device " << d << ": " << rc << " " << (rc ? s.error() : ""));
      REQUIRE(rc == 0);
      CHECK(std::memchr(info.vendor, 0, sizeof(info.vendor)) != nullptr);
      CHECK(std::memchr(info.model, 0, sizeof(info.model)) != nullptr);
      CHECK(std::memchr(info.pci_bus_id, 0, sizeof(info.pci_bus_id)) != nullptr);
      CHECK(info.vendor[0] != '\0');
      CHECK(info.numa_node >= -1);
      CHECK((info.mem_kind == HMC_MEM_HOST || info.mem_kind == HMC_MEM_DEVICE));
      CHECK(info.memory_bytes > 0);
      std::fprintf(stderr, "%s device %d: vendor '%.32s' model '%.96s' pci '%.32s' numa %d %s %llu bytes\n",
                   s.p->name, d, info.vendor, info.model, info.pci_bus_id, info.numa_node,
                   info.mem_kind == HMC_MEM_HOST ? "host" : "device",
                   static_cast<unsigned long long>(info.memory_bytes));
    }
  });
}

// ---- memory and copy ---------------------------------------------------------------

TEST_CASE("memory of every supported kind is allocated, usable and freed", "[conformance][memory]") {
  for_each_plugin([](Session& s) {
    std::mt19937_64 rng(seed());
    struct Kind {
      int kind;
      const char* name;
      bool required;
    };
    const Kind kinds[] = {
        {HMC_ALLOC_DEVICE, "device", s.has(HMC_DEV_CAP_DEVICE_MEM)},
        {HMC_ALLOC_PINNED_HOST, "pinned host", s.has(HMC_DEV_CAP_PINNED_HOST)},
        {HMC_ALLOC_SHAREABLE, "shareable", s.has(HMC_DEV_CAP_SHAREABLE)},
    };
    for (const Kind& k : kinds) {
      for (size_t bytes : {size_t{1}, size_t{4097}, size_t{(1 << 20) + 7}}) {
        INFO(k.name << " memory, " << bytes << " bytes");
        void* a = nullptr;
        void* b = nullptr;
        const int rc = s.p->mem_alloc(s.state, 0, bytes, k.kind, &a);
        if (!k.required) {
          // Capability clear: an error is the answer; a success must still be usable.
          if (rc != 0) {
            CHECK(rc < 0);
            continue;
          }
        }
        INFO("mem_alloc: " << rc << " " << (rc ? s.error() : ""));
        REQUIRE(rc == 0);
        REQUIRE(a != nullptr);
        REQUIRE(s.p->mem_alloc(s.state, 0, bytes, k.kind, &b) == 0);
        CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0);
        const auto x = reinterpret_cast<uintptr_t>(a);
        const auto y = reinterpret_cast<uintptr_t>(b);
        CHECK((x + bytes <= y || y + bytes <= x));  // two blocks never overlap
        std::vector<uint8_t> pattern(bytes);
        for (auto& c : pattern) c = static_cast<uint8_t>(rng());
        std::vector<uint8_t> back(bytes, 0xa5);
        REQUIRE(s.p->copy(s.state, a, pattern.data(), bytes, nullptr) == 0);
        REQUIRE(s.p->copy(s.state, b, a, bytes, nullptr) == 0);
        REQUIRE(s.p->copy(s.state, back.data(), b, bytes, nullptr) == 0);
        CHECK(first_difference(back, pattern) == "");
        if (k.kind == HMC_ALLOC_PINNED_HOST) {  // pinned host memory is the CPU's too
          CHECK(std::memcmp(a, pattern.data(), bytes) == 0);
          std::memset(a, 0x3c, bytes);
          REQUIRE(s.p->copy(s.state, back.data(), a, bytes, nullptr) == 0);
          CHECK(std::all_of(back.begin(), back.end(), [](uint8_t c) { return c == 0x3c; }));
        }
        CHECK(s.p->mem_free(s.state, 0, b) == 0);
        CHECK(s.p->mem_free(s.state, 0, a) == 0);
      }
    }
  });
}

TEST_CASE("copy moves exactly the requested bytes", "[conformance][copy]") {
  for_each_plugin([](Session& s) {
    std::mt19937_64 rng(seed());
    constexpr size_t kOffset = 5;  // odd offsets must work: copy is bytes
    constexpr size_t kGuard = 64;
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4101}, size_t{(1 << 20) + 13}}) {
      INFO(n << " bytes at offset " << kOffset);
      const size_t total = kOffset + n + kGuard;
      Buffer first(s, total);
      Buffer second(s, total);
      first.poison();
      second.poison();
      std::vector<uint8_t> src(n);
      for (auto& c : src) c = static_cast<uint8_t>(rng());
      first.write(src.data(), n, kOffset);
      REQUIRE(s.p->copy(s.state, static_cast<char*>(second.ptr) + kOffset,
                        static_cast<char*>(first.ptr) + kOffset, n, nullptr) == 0);
      const auto back = second.read(total);
      std::vector<uint8_t> want(total, 0xa5);
      std::copy(src.begin(), src.end(), want.begin() + kOffset);
      CHECK(first_difference(back, want) == "");
      if (s.has(HMC_DEV_CAP_STREAMS) && n > 0) {  // the same on a stream
        void* stream = nullptr;
        REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
        std::vector<uint8_t> out(n + kGuard, 0xa5);
        REQUIRE(s.p->copy(s.state, out.data(), static_cast<char*>(second.ptr) + kOffset, n, stream) == 0);
        sync_stream(s, stream);
        CHECK(std::equal(src.begin(), src.end(), out.begin()));
        CHECK(std::all_of(out.begin() + n, out.end(), [](uint8_t c) { return c == 0xa5; }));
        CHECK(s.p->stream_destroy(s.state, stream) == 0);
      }
    }
  });
}

namespace {

// One kind of memory a copy may touch: pageable host memory (the kit's own), or a
// block of one of the provider's alloc kinds.
struct Memory {
  Session* s = nullptr;
  int kind = -1;  // -1: pageable host memory
  void* ptr = nullptr;
  size_t bytes = 0;
  Memory(Session& session, int alloc_kind, size_t n) : s(&session), kind(alloc_kind), bytes(n) {
    if (kind < 0) {
      ptr = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
      REQUIRE(ptr != nullptr);
      return;
    }
    const int rc = s->p->mem_alloc(s->state, 0, n, kind, &ptr);
    INFO("mem_alloc(" << n << ", kind " << kind << "): " << rc << " " << (rc ? s->error() : ""));
    REQUIRE(rc == 0);
  }
  ~Memory() {
    if (kind < 0) std::free(ptr);
    else s->p->mem_free(s->state, 0, ptr);
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  char* at(size_t offset) const { return static_cast<char*>(ptr) + offset; }
};

const char* memory_name(int kind) {
  switch (kind) {
    case -1: return "pageable host";
    case HMC_ALLOC_DEVICE: return "device";
    case HMC_ALLOC_PINNED_HOST: return "pinned host";
    case HMC_ALLOC_SHAREABLE: return "shareable";
  }
  return "?";
}

}  // namespace

TEST_CASE("copy works between every kind of memory, synchronously and on a stream",
          "[conformance][copy]") {
  for_each_plugin([](Session& s) {
    std::mt19937_64 rng(seed());
    std::vector<int> kinds = {-1};
    if (s.has(HMC_DEV_CAP_DEVICE_MEM)) kinds.push_back(HMC_ALLOC_DEVICE);
    if (s.has(HMC_DEV_CAP_PINNED_HOST)) kinds.push_back(HMC_ALLOC_PINNED_HOST);
    if (s.has(HMC_DEV_CAP_SHAREABLE)) kinds.push_back(HMC_ALLOC_SHAREABLE);
    void* stream = nullptr;
    if (s.has(HMC_DEV_CAP_STREAMS)) REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
    constexpr size_t kOffset = 3;
    constexpr size_t kGuard = 29;
    constexpr size_t n = (size_t{1} << 20) + 13;
    const size_t total = kOffset + n + kGuard;
    // Staging for reading any kind back: a synchronous copy into pageable memory.
    std::vector<uint8_t> back(total);
    for (int from : kinds) {
      for (int to : kinds) {
        std::vector<void*> streams = {nullptr};
        if (stream != nullptr) streams.push_back(stream);
        for (void* st : streams) {
          const std::string what = std::string(memory_name(from)) + " -> " + memory_name(to) +
                                   (st ? " on a stream" : " synchronously");
          INFO(what);
          Memory src(s, from, total), dst(s, to, total);
          std::vector<uint8_t> data(total), poison(total, 0xa5);
          for (auto& c : data) c = static_cast<uint8_t>(rng());
          REQUIRE(s.p->copy(s.state, src.ptr, data.data(), total, nullptr) == 0);
          REQUIRE(s.p->copy(s.state, dst.ptr, poison.data(), total, nullptr) == 0);
          const int rc = s.p->copy(s.state, dst.at(kOffset), src.at(kOffset), n, st);
          INFO("copy: " << rc << " " << (rc ? s.error() : ""));
          REQUIRE(rc == 0);
          sync_stream(s, st);
          std::fill(back.begin(), back.end(), 0x11);
          REQUIRE(s.p->copy(s.state, back.data(), dst.ptr, total, nullptr) == 0);
          std::vector<uint8_t> want = poison;
          std::copy(data.begin() + kOffset, data.begin() + kOffset + n, want.begin() + kOffset);
          CHECK(first_difference(back, want) == "");
          if (to == -1 || to == HMC_ALLOC_PINNED_HOST) {  // host memory: look directly too
            CHECK(std::memcmp(dst.ptr, want.data(), total) == 0);
          }
        }
      }
    }
    if (stream != nullptr) CHECK(s.p->stream_destroy(s.state, stream) == 0);
  });
}

// ---- reduce and divide -----------------------------------------------------------------

namespace {

// Runs one reduce of n elements on provider memory and checks it, with dst distinct
// from, or equal to, the inputs ("out", "into a", "into b", "all same"). `shift`
// moves all three buffers by that many elements (off the 16-byte alignment that
// vector kernels like). Inputs and outputs go through `copy`: the kit never
// dereferences provider memory.
void check_reduce(Session& s, const Dtype& t, int op, size_t n, const std::string& layout,
                  void* stream, std::mt19937_64& rng, size_t shift = 0) {
  constexpr size_t kGuard = 16;
  const auto a = random_array(t, n, rng);
  const auto b = layout == "all same" ? a : random_array(t, n, rng);
  const size_t bytes = (n + kGuard + shift) * t.size;
  const size_t at = shift * t.size;
  Buffer da(s, bytes), db(s, bytes), dd(s, bytes);
  dd.poison();
  da.write(a.data(), n * t.size, at);
  db.write(b.data(), n * t.size, at);
  void* dst = static_cast<char*>(dd.ptr) + at;
  const void* src_a = static_cast<char*>(da.ptr) + at;
  const void* src_b = static_cast<char*>(db.ptr) + at;
  if (layout == "into a") dst = static_cast<char*>(da.ptr) + at;
  if (layout == "into b") dst = static_cast<char*>(db.ptr) + at;
  if (layout == "all same") src_a = src_b = dst = static_cast<char*>(da.ptr) + at;
  const std::string what = std::string(t.name) + " " + kOpNames[op] + " n=" + std::to_string(n) + " " + layout +
                           (shift ? " shifted by " + std::to_string(shift) : "") + (stream ? " on a stream" : "");
  const int rc = s.p->reduce(s.state, dst, src_a, src_b, n, t.id, op, stream);
  INFO(what << ": rc " << rc << " " << (rc ? s.error() : ""));
  REQUIRE(rc == 0);
  sync_stream(s, stream);
  Buffer* out = layout == "out" ? &dd : layout == "into b" ? &db : &da;
  const auto all = out->read(bytes);
  const uint8_t* got = all.data() + at;
  Tally tally;
  for (size_t i = 0; i < n; ++i) {
    tally.add(t, i, load(t, got, i), ref_op(t, op, load(t, a.data(), i), load(t, b.data(), i)),
              std::string(t.name) + " " + kOpNames[op]);
  }
  if (layout == "out") {
    INFO(what << ": bytes outside dst changed");
    CHECK(std::all_of(all.begin(), all.begin() + at, [](uint8_t c) { return c == 0xa5; }));
    CHECK(std::all_of(all.begin() + at + n * t.size, all.end(), [](uint8_t c) { return c == 0xa5; }));
  }
  report(tally, what);
}

}  // namespace

TEST_CASE("reduce matches the reference for every dtype and op", "[conformance][reduce]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_REDUCE)) {
      WARN(s.p->name << " has no REDUCE capability: skipped");
      return;
    }
    std::mt19937_64 rng(seed());
    for (const Dtype& t : kDtypes) {
      for (int op = 0; op < HMC_OP_COUNT; ++op) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
          check_reduce(s, t, op, n, "out", nullptr, rng);
        }
        for (const char* layout : {"into a", "into b", "all same"}) {
          check_reduce(s, t, op, 1000, layout, nullptr, rng);
        }
        if (s.has(HMC_DEV_CAP_STREAMS)) {
          void* stream = nullptr;
          REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
          check_reduce(s, t, op, 65537, "out", stream, rng);
          check_reduce(s, t, op, 65537, "into b", stream, rng);
          CHECK(s.p->stream_destroy(s.state, stream) == 0);
        }
        // Off the vector alignment, with a tail of every length.
        check_reduce(s, t, op, 1000 + static_cast<size_t>(op), "out", nullptr, rng, 1);
        check_reduce(s, t, op, 4099, "into a", nullptr, rng, 3);
      }
    }
  });
}

TEST_CASE("reduce handles large counts", "[conformance][reduce][large]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_REDUCE)) return;
    std::mt19937_64 rng(seed());
    // 2^24 + 3 elements on device memory: many grid-stride rounds of a kernel and a
    // ragged tail; sum for every dtype out of place, and another op in place on a
    // stream for one dtype of each width. Host-memory providers loop over plain
    // memory: 2^20 + 3 suffices there and keeps the reference computation short on
    // small machines. HMC_CONFORMANCE_LARGE=<count> sets the count (0 skips).
    size_t large = s.has(HMC_DEV_CAP_DEVICE_MEM) ? (size_t{1} << 24) + 3 : (size_t{1} << 20) + 3;
    if (const char* v = std::getenv("HMC_CONFORMANCE_LARGE"); v != nullptr && v[0] != '\0') {
      large = std::strtoull(v, nullptr, 0);
    }
    if (large == 0) {
      WARN("HMC_CONFORMANCE_LARGE=0: large counts skipped");
      return;
    }
    void* stream = nullptr;
    if (s.has(HMC_DEV_CAP_STREAMS)) REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
    for (const Dtype& t : kDtypes) {
      check_reduce(s, t, HMC_OP_SUM, large, "out", nullptr, rng);
      if (t.id == HMC_DTYPE_INT8 || t.id == HMC_DTYPE_FP16 || t.id == HMC_DTYPE_FP32 || t.id == HMC_DTYPE_UINT64) {
        check_reduce(s, t, t.is_float ? HMC_OP_MAX : HMC_OP_PROD, large, "into a", stream, rng);
      }
    }
    if (stream != nullptr) CHECK(s.p->stream_destroy(s.state, stream) == 0);
  });
}

TEST_CASE("reduce keeps NaN and infinities and round-trips every fp16/bf16 value",
          "[conformance][reduce]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_REDUCE)) return;
    std::mt19937_64 rng(seed());
    for (const Dtype& t : kDtypes) {
      if (!t.is_float) continue;
      // NaN in either input gives NaN for every op; inf follows IEEE.
      const double nan = std::nan("");
      const std::vector<std::pair<double, double>> pairs = {
          {nan, 1.0}, {1.0, nan}, {nan, nan}, {-nan, 2.0}, {INFINITY, 1.0}, {-INFINITY, 3.0},
          {INFINITY, -INFINITY}, {-0.0, 0.0}, {0.0, -0.0}, {-0.0, -0.0}};
      const size_t n = pairs.size();
      std::vector<uint8_t> a(n * t.size), b(n * t.size);
      for (size_t i = 0; i < n; ++i) {
        store(t, a.data(), i, from_double(t, pairs[i].first));
        store(t, b.data(), i, from_double(t, pairs[i].second));
      }
      Buffer da(s, a.size()), db(s, b.size()), dd(s, a.size());
      da.write(a.data(), a.size());
      db.write(b.data(), b.size());
      for (int op = 0; op < HMC_OP_COUNT; ++op) {
        dd.poison();
        REQUIRE(s.p->reduce(s.state, dd.ptr, da.ptr, db.ptr, n, t.id, op, nullptr) == 0);
        const auto got = dd.read(a.size());
        Tally tally;
        for (size_t i = 0; i < n; ++i) {
          tally.add(t, i, load(t, got.data(), i), ref_op(t, op, load(t, a.data(), i), load(t, b.data(), i)),
                    std::string(t.name) + " " + kOpNames[op] + " special values");
        }
        report(tally, std::string(t.name) + " " + kOpNames[op] + " with NaN/inf/signed zeros");
      }
    }
    // Every fp16 and bf16 bit pattern: x + (-0) and max(x, x) give x back exactly
    // (a NaN stays a NaN); x op random tests rounding from every input.
    for (const Dtype& t : kDtypes) {
      if (t.size != 2 || !t.is_float) continue;
      constexpr size_t n = 65536;
      std::vector<uint8_t> all(n * 2), neg_zero(n * 2), other(n * 2);
      for (size_t i = 0; i < n; ++i) {
        store(t, all.data(), i, i);
        store(t, neg_zero.data(), i, 0x8000);
        store(t, other.data(), i, random_element(t, rng));
      }
      Buffer da(s, n * 2), db(s, n * 2), dd(s, n * 2);
      da.write(all.data(), n * 2);
      const std::pair<int, const std::vector<uint8_t>*> runs[] = {
          {HMC_OP_SUM, &neg_zero}, {HMC_OP_MAX, &all},   {HMC_OP_MIN, &all},   {HMC_OP_SUM, &other},
          {HMC_OP_PROD, &other},   {HMC_OP_MIN, &other}, {HMC_OP_MAX, &other}};
      for (const auto& [op, rhs] : runs) {
        db.write(rhs->data(), n * 2);
        dd.poison();
        REQUIRE(s.p->reduce(s.state, dd.ptr, da.ptr, db.ptr, n, t.id, op, nullptr) == 0);
        const auto got = dd.read(n * 2);
        Tally tally;
        for (size_t i = 0; i < n; ++i) {
          tally.add(t, i, load(t, got.data(), i), ref_op(t, op, i, load(t, rhs->data(), i)),
                    std::string(t.name) + " every pattern " + kOpNames[op]);
        }
        report(tally, std::string(t.name) + " every bit pattern, " + kOpNames[op]);
      }
    }
  });
}

TEST_CASE("divide finishes an average", "[conformance][reduce]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_REDUCE)) return;
    std::mt19937_64 rng(seed());
    // Small divisors are rank counts; the large ones check that no divisor is
    // truncated or rounded on the way (2^63 exceeds every signed type).
    const uint64_t divisors[] = {1,          2,          3,         7,          10,
                                 1000,       65535,      65537,     1ull << 24, (1ull << 24) + 1,
                                 1000000000039ull, 1ull << 63, ~0ull};
    for (const Dtype& t : kDtypes) {
      for (uint64_t d : divisors) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
          auto x = random_array(t, n, rng);
          if (!t.is_float && t.is_signed && n > 0) {  // the most negative value, whose magnitude overflows
            store(t, x.data(), 0, (mask_of(t) >> 1) + 1);
          }
          Buffer buf(s, x.size() + 16);
          buf.write(x.data(), x.size());
          const int rc = s.p->divide(s.state, buf.ptr, n, t.id, d, nullptr);
          INFO(t.name << " / " << d << " n=" << n << ": rc " << rc << " " << (rc ? s.error() : ""));
          REQUIRE(rc == 0);
          const auto got = buf.read(x.size());
          Tally tally;
          for (size_t i = 0; i < n; ++i) {
            tally.add(t, i, load(t, got.data(), i), ref_divide(t, load(t, x.data(), i), d),
                      std::string(t.name) + " / " + std::to_string(d));
          }
          report(tally, std::string(t.name) + " divide by " + std::to_string(d));
        }
      }
    }
    // avg = sum then divide, as a collective does it.
    const Dtype& f32 = kDtypes[HMC_DTYPE_FP32];
    const auto a = random_array(f32, 1000, rng);
    const auto b = random_array(f32, 1000, rng);
    Buffer da(s, a.size()), db(s, b.size());
    da.write(a.data(), a.size());
    db.write(b.data(), b.size());
    REQUIRE(s.p->reduce(s.state, da.ptr, da.ptr, db.ptr, 1000, HMC_DTYPE_FP32, HMC_OP_AVG, nullptr) == 0);
    REQUIRE(s.p->divide(s.state, da.ptr, 1000, HMC_DTYPE_FP32, 2, nullptr) == 0);
    const auto got = da.read(a.size());
    Tally tally;
    for (size_t i = 0; i < 1000; ++i) {
      const uint64_t sum = ref_op(f32, HMC_OP_SUM, load(f32, a.data(), i), load(f32, b.data(), i));
      tally.add(f32, i, load(f32, got.data(), i), ref_divide(f32, sum, 2), "fp32 avg");
    }
    report(tally, "fp32 avg of two");
  });
}

// ---- streams and events ------------------------------------------------------------

TEST_CASE("streams and events complete", "[conformance][streams]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_STREAMS)) {
      WARN(s.p->name << " has no STREAMS capability: skipped");
      return;
    }
    void* s1 = nullptr;
    void* s2 = nullptr;
    void* e1 = nullptr;
    void* e2 = nullptr;
    REQUIRE(s.p->stream_create(s.state, 0, &s1) == 0);
    REQUIRE(s.p->stream_create(s.state, 0, &s2) == 0);
    REQUIRE(s.p->event_create(s.state, 0, &e1) == 0);
    REQUIRE(s.p->event_create(s.state, 0, &e2) == 0);
    CHECK(s1 != s2);
    CHECK(e1 != e2);
    // Data copied on s1, then on s2 after waiting for s1's event, arrives intact.
    std::mt19937_64 rng(seed());
    constexpr size_t n = 1 << 20;
    std::vector<uint8_t> src(n), back(n, 0xa5);
    for (auto& c : src) c = static_cast<uint8_t>(rng());
    Buffer mid(s, n);
    REQUIRE(s.p->copy(s.state, mid.ptr, src.data(), n, s1) == 0);
    REQUIRE(s.p->event_record(s.state, e1, s1) == 0);
    REQUIRE(s.p->stream_wait_event(s.state, s2, e1) == 0);
    REQUIRE(s.p->copy(s.state, back.data(), mid.ptr, n, s2) == 0);
    REQUIRE(s.p->event_record(s.state, e2, s2) == 0);
    REQUIRE(wait_event(s, e2));
    CHECK(first_difference(back, src) == "");
    // stream_query settles to 0 within the deadline.
    const auto deadline = Clock::now() + timeout();
    int rc = HMC_PROV_IN_PROGRESS;
    while ((rc = s.p->stream_query(s.state, s2)) == HMC_PROV_IN_PROGRESS && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    CHECK(rc == 0);
    // An event recorded on the synchronous (NULL) stream is complete at once after.
    REQUIRE(s.p->event_record(s.state, e1, nullptr) == 0);
    CHECK(wait_event(s, e1));
    CHECK(s.p->event_destroy(s.state, e2) == 0);
    CHECK(s.p->event_destroy(s.state, e1) == 0);
    CHECK(s.p->stream_destroy(s.state, s2) == 0);
    CHECK(s.p->stream_destroy(s.state, s1) == 0);
  });
}

// ---- stream flags, dma-buf, bandwidth -----------------------------------------------------

TEST_CASE("work queued after stream_wait_flag waits for the flag", "[conformance][flags]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_STREAM_FLAGS)) {
      WARN(s.p->name << " has no STREAM_FLAGS capability: skipped");
      return;
    }
    volatile uint32_t* flag = nullptr;
    int rc = s.p->flag_alloc(s.state, 0, &flag);
    INFO("flag_alloc: " << rc << " " << (rc ? s.error() : ""));
    if (rc == HMC_PROV_ERR_UNSUPPORTED) {  // the device lacks stream memory operations
      WARN(s.p->name << ": stream flags unsupported here: " << s.error());
      return;
    }
    REQUIRE(rc == 0);
    REQUIRE(flag != nullptr);
    CHECK(*flag == 0);  // host memory the CPU reads and writes
    void* stream = nullptr;
    REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
    std::mt19937_64 rng(seed());
    constexpr size_t n = (1 << 20) + 5;
    std::vector<uint8_t> data(n), poison(n, 0xa5);
    for (auto& c : data) c = static_cast<uint8_t>(rng());
    Buffer src(s, n), dst(s, n);
    src.write(data.data(), n);
    dst.write(poison.data(), n);
    // Whatever happens below, release the stream before it is destroyed.
    struct Release {
      volatile uint32_t* f;
      ~Release() { __atomic_store_n(f, 0xffffffffu, __ATOMIC_RELEASE); }
    } release{flag};
    rc = s.p->stream_wait_flag(s.state, stream, flag, 2);
    INFO("stream_wait_flag: " << rc << " " << (rc ? s.error() : ""));
    if (rc == HMC_PROV_ERR_UNSUPPORTED) {
      WARN(s.p->name << ": stream flags unsupported on this device: " << s.error());
    } else {
      REQUIRE(rc == 0);
      REQUIRE(s.p->copy(s.state, dst.ptr, src.ptr, n, stream) == 0);
      void* event = nullptr;
      REQUIRE(s.p->event_create(s.state, 0, &event) == 0);
      REQUIRE(s.p->event_record(s.state, event, stream) == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK(s.p->stream_query(s.state, stream) == HMC_PROV_IN_PROGRESS);
      CHECK(s.p->event_query(s.state, event) == HMC_PROV_IN_PROGRESS);
      CHECK(first_difference(dst.read(n), poison) == "");  // the copy has not run
      __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);  // below the value waited for: still waiting
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK(s.p->event_query(s.state, event) == HMC_PROV_IN_PROGRESS);
      CHECK(first_difference(dst.read(n), poison) == "");
      __atomic_store_n(flag, 3u, __ATOMIC_RELEASE);  // >= 2: the stream goes on
      CHECK(wait_event(s, event));
      CHECK(first_difference(dst.read(n), data) == "");
      CHECK(s.p->event_destroy(s.state, event) == 0);
      // A flag already at the value does not wait.
      REQUIRE(s.p->stream_wait_flag(s.state, stream, flag, 3) == 0);
      sync_stream(s, stream);
    }
    // Errors: a pointer that is not a flag, a double free.
    uint32_t not_a_flag = 0;
    CHECK(s.p->stream_wait_flag(s.state, stream, &not_a_flag, 1) < 0);
    CHECK(s.p->flag_free(s.state, flag) == 0);
    CHECK(s.p->flag_free(s.state, flag) < 0);
    release.f = &not_a_flag;
    CHECK(s.p->stream_destroy(s.state, stream) == 0);
  });
}

TEST_CASE("registered host memory copies both ways and unregisters cleanly", "[conformance][host_register]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_HOST_REGISTER)) {
      WARN(s.p->name << " has no HOST_REGISTER capability: skipped");
      return;
    }
    constexpr size_t n = (4 << 20) + 4096;
    std::mt19937_64 rng(seed());
    std::vector<uint8_t> data(n);
    for (auto& c : data) c = static_cast<uint8_t>(rng());
    // Pageable memory the way HMC meets it: malloc'd, and a shared mapping (a peer's buffer).
    void* heap = std::aligned_alloc(4096, n);
    REQUIRE(heap != nullptr);
    void* shared = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(shared != MAP_FAILED);
    std::memcpy(heap, data.data(), n);
    std::memset(shared, 0xa5, n);
    int rc = s.p->host_register(s.state, heap, n);
    INFO("host_register(heap): " << rc << " " << (rc ? s.error() : ""));
    REQUIRE(rc == 0);
    rc = s.p->host_register(s.state, shared, n);
    INFO("host_register(shared): " << rc << " " << (rc ? s.error() : ""));
    REQUIRE(rc == 0);
    // Overlaps are refused: the host registers each range once.
    CHECK(s.p->host_register(s.state, static_cast<char*>(heap) + 4096, 4096) < 0);
    Buffer mid(s, n);
    mid.write(heap, n);  // registered -> provider memory
    REQUIRE(s.p->copy(s.state, shared, mid.ptr, n, nullptr) == 0);  // provider memory -> registered
    CHECK(first_difference(std::vector<uint8_t>(static_cast<uint8_t*>(shared), static_cast<uint8_t*>(shared) + n), data) == "");
    if (s.has(HMC_DEV_CAP_STREAMS)) {  // the same on a stream, at an odd offset
      std::memset(shared, 0x5a, n);
      void* stream = nullptr;
      REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
      REQUIRE(s.p->copy(s.state, static_cast<char*>(shared) + 3, mid.ptr, n - 3, stream) == 0);
      sync_stream(s, stream);
      std::vector<uint8_t> want(n, 0x5a);
      std::copy(data.begin(), data.end() - 3, want.begin() + 3);
      CHECK(first_difference(std::vector<uint8_t>(static_cast<uint8_t*>(shared), static_cast<uint8_t*>(shared) + n), want) == "");
      CHECK(s.p->stream_destroy(s.state, stream) == 0);
    }
    CHECK(s.p->host_unregister(s.state, shared) == 0);
    CHECK(s.p->host_unregister(s.state, shared) < 0);  // twice
    CHECK(s.p->host_unregister(s.state, static_cast<char*>(heap) + 4096) < 0);  // not a registered start
    CHECK(s.p->host_unregister(s.state, heap) == 0);
    // Unregistered memory still copies, and registers again.
    std::memset(shared, 0, n);
    REQUIRE(s.p->copy(s.state, shared, mid.ptr, n, nullptr) == 0);
    CHECK(std::memcmp(shared, data.data(), n) == 0);
    CHECK(s.p->host_register(s.state, heap, n) == 0);
    CHECK(s.p->host_unregister(s.state, heap) == 0);
    CHECK(s.p->host_register(s.state, nullptr, n) < 0);
    CHECK(s.p->host_register(s.state, heap, 0) < 0);
    munmap(shared, n);
    std::free(heap);
  });
}

TEST_CASE("mem_query knows device memory and nothing else", "[conformance][mem_query]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_MEM_QUERY)) {
      WARN(s.p->name << " has no MEM_QUERY capability: skipped");
      return;
    }
    struct Answer {
      int rc = -100;
      int device = -1;
      uintptr_t base = 0;
      size_t bytes = 0;
      uint64_t id = 0;
    };
    auto query = [&](const void* p) {
      Answer a;
      void* base = nullptr;
      a.rc = s.p->mem_query(s.state, p, &a.device, &base, &a.bytes, &a.id);
      a.base = reinterpret_cast<uintptr_t>(base);
      INFO("mem_query(" << p << "): " << a.rc << " " << (a.rc < 0 ? s.error() : ""));
      CHECK((a.rc == 0 || a.rc == 1));
      return a;
    };
    // Host memory of every kind is not device memory: the heap, a large (mmap'd)
    // malloc, the stack, NULL and pinned host memory.
    void* small = std::malloc(64);
    void* large = std::malloc(8 << 20);
    REQUIRE((small != nullptr && large != nullptr));
    int on_stack = 0;
    const void* const host[] = {small, large, &on_stack, nullptr};
    for (const void* p : host) CHECK(query(p).rc == 1);
    std::free(small);
    std::free(large);
    if (s.has(HMC_DEV_CAP_PINNED_HOST)) {
      void* pinned = nullptr;
      REQUIRE(s.p->mem_alloc(s.state, 0, 1 << 20, HMC_ALLOC_PINNED_HOST, &pinned) == 0);
      CHECK(query(static_cast<char*>(pinned) + 4096).rc == 1);
      CHECK(s.p->mem_free(s.state, 0, pinned) == 0);
    }
    if (!s.has(HMC_DEV_CAP_DEVICE_MEM)) return;
    int count = 0;
    REQUIRE(s.p->device_count(s.state, &count) == 0);
    constexpr size_t kSize = 1 << 20;
    for (int d = 0; d < count; ++d) {
      hmc_device_info_t info{};
      info.struct_size = sizeof(info);
      REQUIRE(s.p->device_info(s.state, d, &info) == 0);
      void* ptr = nullptr;
      REQUIRE(s.p->mem_alloc(s.state, d, kSize, HMC_ALLOC_DEVICE, &ptr) == 0);
      const auto start = reinterpret_cast<uintptr_t>(ptr);
      INFO("device " << d << ", block [" << ptr << ", +" << kSize << ")");
      const Answer in = query(static_cast<char*>(ptr) + 4096);
      if (info.mem_kind == HMC_MEM_HOST) {  // the CPU reaches this device's memory
        CHECK(in.rc == 1);
      } else {
        CHECK(in.rc == 0);
        CHECK(in.device == d);
        CHECK(in.base <= start);
        CHECK(in.base + in.bytes >= start + kSize);
        CHECK(query(static_cast<char*>(ptr) + kSize - 1).id == in.id);  // one allocation, one id
      }
      CHECK(s.p->mem_free(s.state, d, ptr) == 0);
      // The host may ask about a stale pointer. A driver may still hold the range (a
      // pool), but nothing was allocated since, so a provider that reported the block
      // itself must not report that freed block again.
      const Answer freed = query(static_cast<char*>(ptr) + 4096);
      if (in.rc == 0 && freed.rc == 0 && in.base == start && in.bytes < 2 * kSize) {
        CHECK_FALSE((freed.base == in.base && freed.bytes == in.bytes));
      }
      // The host keeps IPC exports by id: an allocation made after the free, at the same
      // address or not, must not get the freed one's.
      void* again = nullptr;
      REQUIRE(s.p->mem_alloc(s.state, d, kSize, HMC_ALLOC_DEVICE, &again) == 0);
      const Answer next = query(again);
      INFO("the next block at " << again << ", ids " << in.id << " then " << next.id);
      if (in.id != 0 && next.id != 0) CHECK(next.id != in.id);
      CHECK(s.p->mem_free(s.state, d, again) == 0);
    }
  });
}

TEST_CASE("dma-buf export gives a file of whole pages around the range", "[conformance][dmabuf]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_DMABUF)) {
      WARN(s.p->name << " has no DMABUF capability: skipped");
      return;
    }
    constexpr size_t kBytes = 4 << 20;
    Buffer buf(s, kBytes);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t at = page + 100;  // not page aligned: the offset says where it starts
    const size_t len = 3 * page;
    int fd = -1;
    uint64_t offset = ~0ull;
    const int rc = s.p->dmabuf_export(s.state, static_cast<char*>(buf.ptr) + at, len, &fd, &offset);
    INFO("dmabuf_export: " << rc << " " << (rc ? s.error() : ""));
    if (rc == HMC_PROV_ERR_UNSUPPORTED) {
      std::fprintf(stderr, "%s: dma-buf unsupported here: %s\n", s.p->name, s.error().c_str());
      WARN(s.p->name << ": dma-buf unsupported here: " << s.error());
      CHECK_FALSE(s.error().empty());
      return;
    }
    REQUIRE(rc == 0);
    REQUIRE(fd >= 0);
    const auto ptr = reinterpret_cast<uintptr_t>(buf.ptr) + at;
    CHECK(offset == ptr % page);
    char link[256] = {};
    const std::string fd_path = "/proc/self/fd/" + std::to_string(fd);
    CHECK(readlink(fd_path.c_str(), link, sizeof(link) - 1) > 0);
    INFO("fd links to " << link);
    CHECK(std::strstr(link, "dmabuf") != nullptr);
    const off_t size = lseek(fd, 0, SEEK_END);
    CHECK(size >= static_cast<off_t>(offset + len));
    CHECK(size % static_cast<off_t>(page) == 0);
    std::fprintf(stderr, "%s: dma-buf fd %d -> %s, %lld bytes, offset %llu\n", s.p->name, fd, link,
                 static_cast<long long>(size), static_cast<unsigned long long>(offset));
    ::close(fd);
    int bad_fd = -1;
    CHECK(s.p->dmabuf_export(s.state, static_cast<char*>(buf.ptr) + at, 0, &bad_fd, &offset) < 0);
  });
}

// Not a test: bandwidth of reduce and of a device copy, for the record (run it by name).
TEST_CASE("reduce bandwidth", "[.][bandwidth]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_REDUCE) || !s.has(HMC_DEV_CAP_STREAMS)) return;
    void* stream = nullptr;
    REQUIRE(s.p->stream_create(s.state, 0, &stream) == 0);
    constexpr size_t kBytes = size_t{256} << 20;
    Buffer a(s, kBytes), b(s, kBytes), d(s, kBytes);
    a.poison(0x11);
    b.poison(0x22);
    // Seconds per call: batches of 5 queued calls (each batch waited for, so that a
    // slow provider stays within the wait deadline) until 20 calls or half a second.
    auto timed = [&](const std::function<void()>& body) {
      body();  // warm up
      sync_stream(s, stream);
      const auto t0 = Clock::now();
      int iters = 0;
      double elapsed = 0;
      while (iters < 20 && (iters == 0 || elapsed < 0.5)) {
        for (int i = 0; i < 5; ++i) body();
        sync_stream(s, stream);
        iters += 5;
        elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      return elapsed / iters;
    };
    const double copy_s = timed([&] { REQUIRE(s.p->copy(s.state, d.ptr, a.ptr, kBytes, stream) == 0); });
    std::fprintf(stderr, "%s: copy of %zu MiB: %.1f GB/s (read + write)\n", s.p->name, kBytes >> 20,
                 2.0 * kBytes / copy_s / 1e9);
    for (const Dtype& t : kDtypes) {
      for (int op : {HMC_OP_SUM, HMC_OP_MAX}) {
        const size_t n = kBytes / t.size;
        const double secs = timed([&] { REQUIRE(s.p->reduce(s.state, d.ptr, a.ptr, b.ptr, n, t.id, op, stream) == 0); });
        const double secs_in = timed([&] { REQUIRE(s.p->reduce(s.state, a.ptr, a.ptr, b.ptr, n, t.id, op, stream) == 0); });
        std::fprintf(stderr, "%s: reduce %s %s %zu MiB: %.1f GB/s out of place, %.1f GB/s into a (3 x bytes / time)\n",
                     s.p->name, t.name, kOpNames[op], kBytes >> 20, 3.0 * kBytes / secs / 1e9, 3.0 * kBytes / secs_in / 1e9);
      }
      const size_t n = kBytes / t.size;
      const double secs = timed([&] { REQUIRE(s.p->divide(s.state, d.ptr, n, t.id, 3, stream) == 0); });
      std::fprintf(stderr, "%s: divide %s by 3, %zu MiB: %.1f GB/s (2 x bytes / time)\n", s.p->name, t.name,
                   kBytes >> 20, 2.0 * kBytes / secs / 1e9);
    }
    CHECK(s.p->stream_destroy(s.state, stream) == 0);
  });
}

// ---- IPC between two processes ---------------------------------------------------------

namespace {

constexpr size_t kIpcBytes = (1 << 20) + 4096 + 3;
constexpr size_t kIpcInterior = 3 * 4096 + 17;  // the child also exports mem + this

std::vector<uint8_t> ipc_pattern(uint64_t salt) {
  std::mt19937_64 rng(seed() ^ salt);
  std::vector<uint8_t> v(kIpcBytes);
  for (auto& c : v) c = static_cast<uint8_t>(rng());
  return v;
}

// Message between parent and child: status (0 ok), then payload (handle or error text).
bool send_msg(int fd, int32_t status, const void* data, uint32_t len) {
  std::vector<uint8_t> buf(8);
  std::memcpy(buf.data(), &status, 4);
  std::memcpy(buf.data() + 4, &len, 4);
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (len > 0) buf.insert(buf.end(), bytes, bytes + len);
  size_t off = 0;
  while (off < buf.size()) {
    const ssize_t w = write(fd, buf.data() + off, buf.size() - off);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

bool read_full(int fd, void* out, size_t len, Clock::time_point deadline) {
  size_t off = 0;
  while (off < len) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t r = read(fd, static_cast<char*>(out) + off, len - off);
    if (r <= 0) return false;  // the other side is gone
    off += static_cast<size_t>(r);
  }
  return true;
}

// Reads one message; false on timeout or EOF.
bool recv_msg(int fd, int32_t* status, std::vector<uint8_t>* data, Clock::time_point deadline) {
  uint32_t len = 0;
  if (!read_full(fd, status, 4, deadline) || !read_full(fd, &len, 4, deadline)) return false;
  if (len > (1u << 20)) return false;
  data->resize(len);
  return read_full(fd, data->data(), len, deadline);
}

// The exporting process: fd 3 reads from the parent, fd 4 writes to it.
int ipc_child(const char* plugin) {
  alarm(static_cast<unsigned>(2 * timeout().count() / 1000 + 5));  // never outlive the test
  auto die = [](const std::string& why) {
    send_msg(4, 1, why.data(), static_cast<uint32_t>(why.size()));
    return 1;
  };
  void* dl = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (!dl) return die(std::string("child dlopen: ") + dlerror());
  auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl, HMC_DEVICE_ENTRY_V1));
  const hmc_device_provider_t* p = entry ? entry() : nullptr;
  if (!p) return die("child: no provider table");
  Host host{hmc::conformance::environment_settings()};
  hmc::conformance::add_param_defaults(host.config, p->params, p->num_params);
  hmc_host_services_t services{sizeof(services), &host, host_log, host_config_get, host_wake};
  void* state = nullptr;
  char reason[512] = {};
  if (p->init(&services, &state, reason, sizeof(reason)) != 0) return die(std::string("child init: ") + reason);
  auto err = [&](const char* what) { return die(std::string("child ") + what + ": " + p->last_error(state)); };
  void* mem = nullptr;
  if (p->mem_alloc(state, 0, kIpcBytes, HMC_ALLOC_SHAREABLE, &mem) != 0) return err("mem_alloc");
  const auto mine = ipc_pattern(1);
  if (p->copy(state, mem, mine.data(), kIpcBytes, nullptr) != 0) return err("copy");
  // Two handles: the whole block, and an interior pointer at an odd offset.
  uint8_t handle[HMC_IPC_HANDLE_MAX];
  size_t len = 0;
  if (p->ipc_export(state, mem, kIpcBytes, handle, sizeof(handle), &len) != 0) return err("ipc_export");
  if (len == 0 || len > sizeof(handle)) return die("child: ipc_export gave a handle of bad length");
  uint8_t inner[HMC_IPC_HANDLE_MAX];
  size_t inner_len = 0;
  if (p->ipc_export(state, static_cast<char*>(mem) + kIpcInterior, kIpcBytes - kIpcInterior, inner, sizeof(inner),
                    &inner_len) != 0) {
    return err("ipc_export(interior pointer)");
  }
  if (inner_len == 0 || inner_len > sizeof(inner)) return die("child: interior ipc_export gave a bad length");
  send_msg(4, 0, handle, static_cast<uint32_t>(len));
  send_msg(4, 0, inner, static_cast<uint32_t>(inner_len));
  // Wait for the parent to write its pattern into our memory, then check it.
  int32_t status = 1;
  std::vector<uint8_t> msg;
  if (!recv_msg(3, &status, &msg, Clock::now() + timeout()) || status != 0) return die("child: no go from parent");
  std::vector<uint8_t> seen(kIpcBytes);
  if (p->copy(state, seen.data(), mem, kIpcBytes, nullptr) != 0) return err("copy back");
  const bool same = seen == ipc_pattern(2);
  const std::string verdict = same ? "ok" : "child: the parent's writes are not in the exported memory";
  send_msg(4, same ? 0 : 1, verdict.data(), static_cast<uint32_t>(verdict.size()));
  p->mem_free(state, 0, mem);
  p->fini(state);
  dlclose(dl);
  return same ? 0 : 1;
}

// Owns a child process: killed and reaped on every way out of the test.
struct Child {
  pid_t pid = -1;
  int status = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);  // bounded: SIGKILL cannot be ignored
    }
  }
  // Waits for a clean exit until the deadline; false on timeout (then killed).
  bool reap(Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
};

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() { REQUIRE(pipe2(fd, O_CLOEXEC) == 0); }
  ~Pipe() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  void close(int i) {
    ::close(fd[i]);
    fd[i] = -1;
  }
};

}  // namespace

TEST_CASE("IPC memory exported by another process is shared both ways", "[conformance][ipc]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_DEV_CAP_IPC)) {
      WARN(s.p->name << " has no IPC capability: skipped");
      return;
    }
    Pipe to_child, from_child;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child.fd[0], 3);  // dup2 clears CLOEXEC
    posix_spawn_file_actions_adddup2(&actions, from_child.fd[1], 4);
    char exe[4096] = {};
    REQUIRE(readlink("/proc/self/exe", exe, sizeof(exe) - 1) > 0);
    const std::string seed_arg = std::to_string(seed());
    const std::string plugin = s.path();
    char* argv[] = {exe, const_cast<char*>("--hmc-ipc-child"), const_cast<char*>(plugin.c_str()),
                    const_cast<char*>(seed_arg.c_str()), nullptr};
    Child child;
    const int spawned = posix_spawn(&child.pid, exe, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(spawned == 0);
    to_child.close(0);
    from_child.close(1);
    const auto deadline = Clock::now() + timeout();

    int32_t status = 1;
    std::vector<uint8_t> msg;
    if (!recv_msg(from_child.fd[0], &status, &msg, deadline)) {
      FAIL("no handle from the child within the deadline");
    }
    const std::string child_error = status != 0 ? std::string(msg.begin(), msg.end()) : "";
    INFO("child: " << child_error);
    REQUIRE(status == 0);
    std::vector<uint8_t> inner;
    if (!recv_msg(from_child.fd[0], &status, &inner, deadline)) {
      FAIL("no second (interior pointer) handle from the child within the deadline");
    }
    INFO("child: " << (status != 0 ? std::string(inner.begin(), inner.end()) : ""));
    REQUIRE(status == 0);
    auto import = [&](const std::vector<uint8_t>& h, const char* what) {
      void* mapped = nullptr;
      const int rc = s.p->ipc_import(s.state, h.data(), h.size(), &mapped);
      INFO(what << ": ipc_import: " << rc << " " << (rc ? s.error() : ""));
      REQUIRE(rc == 0);
      REQUIRE(mapped != nullptr);
      return mapped;
    };
    const auto theirs = ipc_pattern(1);
    void* mapped = import(msg, "whole block");
    std::vector<uint8_t> seen(kIpcBytes, 0xa5);
    REQUIRE(s.p->copy(s.state, seen.data(), mapped, kIpcBytes, nullptr) == 0);
    CHECK(first_difference(seen, theirs) == "");  // the child's data, seen by the parent
    // The same allocation again, through the interior handle and the same handle:
    // each import is its own, and closing one leaves the others mapped.
    void* interior = import(inner, "interior pointer");
    std::vector<uint8_t> seen_inner(kIpcBytes - kIpcInterior, 0xa5);
    REQUIRE(s.p->copy(s.state, seen_inner.data(), interior, seen_inner.size(), nullptr) == 0);
    CHECK(first_difference(seen_inner, std::vector<uint8_t>(theirs.begin() + kIpcInterior, theirs.end())) == "");
    if (s.p->caps & HMC_DEV_CAP_IPC_EXTENT) {  // what each view maps, from the mapping itself
      size_t whole = 0, rest = 0;
      REQUIRE(s.p->ipc_extent(s.state, mapped, &whole) == 0);
      REQUIRE(s.p->ipc_extent(s.state, interior, &rest) == 0);
      CHECK(whole >= kIpcBytes);
      CHECK(rest == whole - kIpcInterior);
      size_t none = 0;
      CHECK(s.p->ipc_extent(s.state, seen.data(), &none) < 0);  // not an import
    }
    void* again = import(msg, "whole block, second import");
    std::vector<uint8_t> seen_again(kIpcBytes, 0xa5);
    REQUIRE(s.p->copy(s.state, seen_again.data(), again, kIpcBytes, nullptr) == 0);
    CHECK(first_difference(seen_again, theirs) == "");
    CHECK(s.p->ipc_close(s.state, again) == 0);
    std::fill(seen.begin(), seen.end(), 0xa5);
    REQUIRE(s.p->copy(s.state, seen.data(), mapped, kIpcBytes, nullptr) == 0);
    CHECK(first_difference(seen, theirs) == "");  // still mapped after closing the second import
    // Our data goes in through both views: the head through the block, the rest
    // through the interior pointer.
    const auto ours = ipc_pattern(2);
    REQUIRE(s.p->copy(s.state, mapped, ours.data(), kIpcInterior, nullptr) == 0);
    REQUIRE(s.p->copy(s.state, interior, ours.data() + kIpcInterior, kIpcBytes - kIpcInterior, nullptr) == 0);
    CHECK(s.p->ipc_close(s.state, interior) == 0);
    CHECK(s.p->ipc_close(s.state, mapped) == 0);  // unmaps our view only
    CHECK(s.p->ipc_close(s.state, mapped) < 0);   // every import closed already
    REQUIRE(send_msg(to_child.fd[1], 0, nullptr, 0));
    if (!recv_msg(from_child.fd[0], &status, &msg, deadline)) {
      FAIL("no verdict from the child within the deadline");
    }
    const std::string verdict(msg.begin(), msg.end());
    INFO("child: " << verdict);
    CHECK(status == 0);  // the parent's data, seen by the child
    REQUIRE(child.reap(deadline));
    CHECK(WIFEXITED(child.status));
    CHECK(WEXITSTATUS(child.status) == 0);
  });
}

// ---- bad arguments ------------------------------------------------------------------

TEST_CASE("bad arguments give an error, not a crash", "[conformance][errors]") {
  for_each_plugin([](Session& s) {
    int count = 0;
    REQUIRE(s.p->device_count(s.state, &count) == 0);
    auto expect_error = [&](int rc, const char* what) {
      INFO(what << " returned " << rc);
      CHECK(rc < 0);
      if (rc < 0) {
        const char* e = s.p->last_error(s.state);
        INFO(what << ": last_error is empty");
        CHECK((e != nullptr && e[0] != '\0'));
      }
    };
    hmc_device_info_t info{};
    info.struct_size = sizeof(info);
    expect_error(s.p->device_count(s.state, nullptr), "device_count(NULL)");
    expect_error(s.p->device_info(s.state, -1, &info), "device_info(-1)");
    expect_error(s.p->device_info(s.state, count, &info), "device_info(count)");
    expect_error(s.p->device_info(s.state, 0, nullptr), "device_info(0, NULL)");
    void* ptr = nullptr;
    expect_error(s.p->mem_alloc(s.state, -1, 64, HMC_ALLOC_PINNED_HOST, &ptr), "mem_alloc(device -1)");
    expect_error(s.p->mem_alloc(s.state, count, 64, HMC_ALLOC_PINNED_HOST, &ptr), "mem_alloc(device count)");
    expect_error(s.p->mem_alloc(s.state, 0, 64, 99, &ptr), "mem_alloc(kind 99)");
    expect_error(s.p->mem_alloc(s.state, 0, 64, HMC_ALLOC_PINNED_HOST, nullptr), "mem_alloc(NULL out)");
    uint8_t host[64] = {};
    expect_error(s.p->copy(s.state, nullptr, host, sizeof(host), nullptr), "copy(NULL dst)");
    expect_error(s.p->copy(s.state, host, nullptr, sizeof(host), nullptr), "copy(NULL src)");
    if (s.has(HMC_DEV_CAP_REDUCE)) {
      Buffer buf(s, 4096);
      void* d = buf.ptr;
      expect_error(s.p->reduce(s.state, d, d, d, 4, -1, HMC_OP_SUM, nullptr), "reduce(dtype -1)");
      expect_error(s.p->reduce(s.state, d, d, d, 4, HMC_DTYPE_COUNT, HMC_OP_SUM, nullptr), "reduce(dtype COUNT)");
      expect_error(s.p->reduce(s.state, d, d, d, 4, HMC_DTYPE_FP32, -1, nullptr), "reduce(op -1)");
      expect_error(s.p->reduce(s.state, d, d, d, 4, HMC_DTYPE_FP32, HMC_OP_COUNT, nullptr), "reduce(op COUNT)");
      expect_error(s.p->reduce(s.state, nullptr, d, d, 4, HMC_DTYPE_FP32, HMC_OP_SUM, nullptr), "reduce(NULL dst)");
      expect_error(s.p->reduce(s.state, d, nullptr, d, 4, HMC_DTYPE_FP32, HMC_OP_SUM, nullptr), "reduce(NULL a)");
      expect_error(s.p->reduce(s.state, d, d, nullptr, 4, HMC_DTYPE_FP32, HMC_OP_SUM, nullptr), "reduce(NULL b)");
      CHECK(s.p->reduce(s.state, nullptr, nullptr, nullptr, 0, HMC_DTYPE_FP32, HMC_OP_SUM, nullptr) == 0);
      expect_error(s.p->divide(s.state, d, 4, HMC_DTYPE_FP32, 0, nullptr), "divide(by 0)");
      expect_error(s.p->divide(s.state, nullptr, 4, HMC_DTYPE_FP32, 2, nullptr), "divide(NULL)");
      expect_error(s.p->divide(s.state, d, 4, 77, 2, nullptr), "divide(dtype 77)");
      CHECK(s.p->divide(s.state, nullptr, 0, HMC_DTYPE_FP32, 2, nullptr) == 0);
    }
    if (s.has(HMC_DEV_CAP_STREAMS)) {
      expect_error(s.p->stream_create(s.state, 0, nullptr), "stream_create(NULL out)");
      expect_error(s.p->event_create(s.state, -1, &ptr), "event_create(device -1)");
      expect_error(s.p->event_record(s.state, nullptr, nullptr), "event_record(NULL event)");
      expect_error(s.p->event_query(s.state, nullptr), "event_query(NULL)");
    }
    if (s.has(HMC_DEV_CAP_IPC)) {
      std::vector<uint8_t> junk(HMC_IPC_HANDLE_MAX);
      std::mt19937_64 rng(seed());
      for (auto& c : junk) c = static_cast<uint8_t>(rng());
      void* mapped = nullptr;
      expect_error(s.p->ipc_import(s.state, junk.data(), junk.size(), &mapped), "ipc_import(random bytes)");
      expect_error(s.p->ipc_import(s.state, junk.data(), 0, &mapped), "ipc_import(0 bytes)");
      expect_error(s.p->ipc_import(s.state, nullptr, 16, &mapped), "ipc_import(NULL)");
      uint8_t handle[HMC_IPC_HANDLE_MAX];
      size_t len = 0;
      std::vector<uint8_t> plain(8192);
      expect_error(s.p->ipc_export(s.state, plain.data(), plain.size(), handle, sizeof(handle), &len),
                   "ipc_export(memory not from mem_alloc)");
      void* shared = nullptr;
      REQUIRE(s.p->mem_alloc(s.state, 0, 4096, HMC_ALLOC_SHAREABLE, &shared) == 0);
      expect_error(s.p->ipc_export(s.state, shared, 4096, handle, 1, &len), "ipc_export(1-byte handle buffer)");
      CHECK(s.p->mem_free(s.state, 0, shared) == 0);
    }
  });
}

// ---- main: the IPC child, or the Catch2 session ----------------------------------------

namespace {

// With HMC_CONFORMANCE_REQUIRE_AVAILABLE=1 (the hardware-labelled CTest runs): exit
// code 77 (CTest's skip) with the reason when a plugin says it is unavailable and no
// such hardware is visible; 1 when it cannot be loaded at all, or when an NVIDIA GPU
// is visible (/dev/nvidia0) and the plugin still says unavailable; else 0 (run).
int require_available() {
  const auto paths = plugin_paths();
  if (paths.empty()) {
    std::fprintf(stderr, "hmc-conformance-device: no plugin to check\n");
    return 1;
  }
  for (const auto& path : paths) {
    void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl == nullptr) {
      std::fprintf(stderr, "hmc-conformance-device: cannot load %s: %s\n", path.c_str(), dlerror());
      return 1;
    }
    auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl, HMC_DEVICE_ENTRY_V1));
    const hmc_device_provider_t* p = entry ? entry() : nullptr;
    if (p == nullptr || p->init == nullptr) {
      std::fprintf(stderr, "hmc-conformance-device: %s has no provider table\n", path.c_str());
      return 1;
    }
    Host host{hmc::conformance::environment_settings()};
    hmc::conformance::add_param_defaults(host.config, p->params, p->num_params);
    hmc_host_services_t services{sizeof(services), &host, host_log, host_config_get, host_wake};
    void* state = nullptr;
    char reason[512] = {};
    const int rc = p->init(&services, &state, reason, sizeof(reason));
    if (rc == HMC_PROV_OK) {
      p->fini(state);
      continue;
    }
    const bool nvidia_gpu = access("/dev/nvidia0", F_OK) == 0;
    if (rc == HMC_PROV_ERR_UNAVAILABLE && !(nvidia_gpu && std::strcmp(p->name, "cuda") == 0)) {
      std::printf("SKIPPED: %s is unavailable here: %s\n", path.c_str(), reason);
      std::fflush(stdout);
      return 77;
    }
    std::fprintf(stderr, "hmc-conformance-device: %s: init failed (%d): %s%s\n", path.c_str(), rc, reason,
                 nvidia_gpu ? " (and /dev/nvidia0 exists)" : "");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--hmc-ipc-child") == 0) {
    setenv("HMC_CONFORMANCE_SEED", argv[3], 1);  // same patterns as the parent
    return ipc_child(argv[2]);
  }
  if (std::strcmp(env_or("HMC_CONFORMANCE_REQUIRE_AVAILABLE", "0"), "1") == 0) {
    const int rc = require_available();
    if (rc != 0) return rc;
  }
  std::fprintf(stderr, "hmc-conformance-device: seed %llu (HMC_CONFORMANCE_SEED), timeout %lld ms\n",
               static_cast<unsigned long long>(seed()), static_cast<long long>(timeout().count()));
  return hmc::test::run_catch(argc, argv);
}
