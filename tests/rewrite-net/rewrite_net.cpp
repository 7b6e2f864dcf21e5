// The rewriting net provider (test only): a hostile peer. It is the tcp provider
// (libhmc-net-tcp.so, loaded from HMC_REWRITE_TCP_PLUGIN, fixed at build time) with one
// change: a control message this process sends may be rewritten first, so that the other
// rank's core receives bytes no honest peer sends. Built into lib/test-providers, which
// no normal context searches; never installed.
//
// Read at each send (so that a process can turn it off after its Context is up):
//   HMCTEST_REWRITE_MODE   unset: send unchanged.  fin: a kFin's size := value.
//                      nak: a kNak's error code (aux) := value.  ipc: a kCtsIpc's offer
//                      says alloc_bytes = UINT64_MAX and offset := value.
//   HMCTEST_REWRITE_VALUE  the value (strtoull, base 0), default 0.
// And, read at each test of a receive: HMCTEST_REWRITE_MODE=bytes reports that many bytes
// received (a provider's own fault, seen by the core of its process); read at each
// connect: HMCTEST_REWRITE_MODE=connect fails it (a rank that cannot reach its peers).
// Core's wire formats come from core/wire.h and the IPC offer's head from
// core/device_path.cpp (OfferHead: magic, handle_len, alloc_id, alloc_bytes, offset, ...).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/wire.h"
#include "hmc/provider/net.h"

namespace {

using hmc::core::MsgType;
using hmc::core::WireHeader;

// Where alloc_bytes and offset lie in an encoded IPC offer (after the message header).
constexpr std::size_t kOfferAllocBytes = 16;
constexpr std::size_t kOfferOffset = 24;

hmc_net_provider_t g_ops;
const hmc_net_provider_t* g_tcp = nullptr;
// tcp sends from the caller's buffer until the request completes: rewritten messages are
// kept for the life of the process (a test rewrites a handful).
std::mutex g_kept_mu;
std::deque<std::vector<unsigned char>> g_kept;

int rewrite_connect(void* state, const void* addr, size_t addr_len, const void* hello, size_t hello_len, void** conn) {
  const char* mode = std::getenv("HMCTEST_REWRITE_MODE");
  if (mode && std::string(mode) == "connect") return HMC_PROV_ERR_UNAVAILABLE;
  return g_tcp->connect(state, addr, addr_len, hello, hello_len, conn);
}

int rewrite_send(void* state, void* conn, const void* buf, size_t len, void** req) {
  const char* mode_env = std::getenv("HMCTEST_REWRITE_MODE");
  if (!mode_env || len < sizeof(WireHeader)) return g_tcp->send_msg(state, conn, buf, len, req);
  const std::string mode = mode_env;
  const char* value_env = std::getenv("HMCTEST_REWRITE_VALUE");
  const uint64_t value = std::strtoull(value_env ? value_env : "0", nullptr, 0);

  std::vector<unsigned char> copy(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + len);
  WireHeader h;
  std::memcpy(&h, copy.data(), sizeof h);
  bool hit = false;
  if (mode == "fin" && h.type == static_cast<uint32_t>(MsgType::kFin)) {
    h.size = value;
    hit = true;
  } else if (mode == "nak" && h.type == static_cast<uint32_t>(MsgType::kNak)) {
    h.aux = value;
    hit = true;
  } else if (mode == "ipc" && h.type == static_cast<uint32_t>(MsgType::kCtsIpc) &&
             len >= sizeof h + kOfferOffset + sizeof(uint64_t)) {
    const uint64_t alloc_bytes = UINT64_MAX;
    std::memcpy(copy.data() + sizeof h + kOfferAllocBytes, &alloc_bytes, sizeof alloc_bytes);
    std::memcpy(copy.data() + sizeof h + kOfferOffset, &value, sizeof value);
    hit = true;
  }
  if (!hit) return g_tcp->send_msg(state, conn, buf, len, req);
  std::memcpy(copy.data(), &h, sizeof h);
  const unsigned char* out;
  {
    std::lock_guard lock(g_kept_mu);
    out = g_kept.emplace_back(std::move(copy)).data();
  }
  std::fprintf(stderr, "[rewrite pid %d] rewrote a message of type %u (%s = %llu)\n", static_cast<int>(getpid()), h.type,
               mode.c_str(), static_cast<unsigned long long>(value));
  return g_tcp->send_msg(state, conn, out, len, req);
}

// The receives in flight: test reports a false size for them in mode "bytes".
std::mutex g_recvs_mu;
std::set<void*> g_recvs;

int rewrite_recv(void* state, void* conn, void* buf, size_t cap, void** req) {
  const int rc = g_tcp->recv_msg(state, conn, buf, cap, req);
  if (rc == 0) {
    std::lock_guard lock(g_recvs_mu);
    g_recvs.insert(*req);
  }
  return rc;
}

int rewrite_test(void* state, void* req, int* done, size_t* bytes, char* message, size_t cap) {
  const int rc = g_tcp->test(state, req, done, bytes, message, cap);
  if (rc != 0 || *done) {
    std::lock_guard lock(g_recvs_mu);
    const char* mode = std::getenv("HMCTEST_REWRITE_MODE");
    const char* value = std::getenv("HMCTEST_REWRITE_VALUE");
    if (g_recvs.erase(req) && rc == 0 && mode && std::string(mode) == "bytes")
      *bytes = std::strtoull(value ? value : "0", nullptr, 0);
  }
  return rc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const hmc_net_provider_t* hmc_net_provider_v1(void) {
  if (g_tcp) return &g_ops;
  void* dl = dlopen(HMC_REWRITE_TCP_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    std::fprintf(stderr, "rewrite: cannot load the tcp provider: %s\n", dlerror());
    return nullptr;
  }
  auto entry = reinterpret_cast<hmc_net_entry_v1_fn>(dlsym(dl, HMC_NET_ENTRY_V1));
  const hmc_net_provider_t* tcp = entry ? entry() : nullptr;
  if (!tcp) {
    std::fprintf(stderr, "rewrite: %s has no usable %s\n", HMC_REWRITE_TCP_PLUGIN, HMC_NET_ENTRY_V1);
    return nullptr;
  }
  std::memcpy(&g_ops, tcp, tcp->struct_size < sizeof g_ops ? tcp->struct_size : sizeof g_ops);
  g_ops.name = "rewrite";
  // tcp's HMC_TCP_* are tcp's names: the host refuses a provider that lists another's.
  // Unlisted, they still read as set, and tcp's code takes its own defaults otherwise.
  g_ops.params = nullptr;
  g_ops.num_params = 0;
  g_ops.connect = rewrite_connect;
  g_ops.send_msg = rewrite_send;
  g_ops.recv_msg = rewrite_recv;
  g_ops.test = rewrite_test;
  g_tcp = tcp;
  return &g_ops;
}
