// Provider life, the thread, progress, and the end of connections.
#include "provider.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

namespace hmc_ucx {

namespace {

// Calls of progress() less than kLinger apart are a host polling (run(), progress()).
constexpr auto kLinger = std::chrono::microseconds(100);
// The longest the thread waits between looks at a host that polls (run()).
constexpr auto kLookMax = std::chrono::microseconds(1000);
// close_conn's flush gives up where the worker moves nothing for this long (a peer behind a
// link that is down: UCX itself notices only after its keepalive, minutes), and at once
// where the flush just before gave up so (an abort closes every peer's connection in turn:
// 10 s each for four peers behind a downed link made one abort take 40 s).
constexpr auto kFlushStall = std::chrono::seconds(1);

std::mutex live_mu;
std::set<const void*> live;  // providers whose endpoints may call back


// Transport names of the context's resources ("tcp", "posix", "cma", ...).
std::set<std::string> transports(ucp_context_h context) {
  std::set<std::string> out;
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return out;
  ucp_context_print_info(context, f);
  std::fclose(f);
  std::string all(text, size);
  std::free(text);
  for (size_t at = all.find("resource"); at != std::string::npos; at = all.find("resource", at + 1)) {
    size_t eol = all.find('\n', at);
    std::string line = all.substr(at, eol - at);
    size_t slash = line.rfind('/');
    size_t space = line.rfind(' ', slash);
    if (slash != std::string::npos && space != std::string::npos)
      out.insert(line.substr(space + 1, slash - space - 1));
  }
  return out;
}

}  // namespace

uint64_t random64() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          static_cast<uint64_t>(getpid()) << 32);
  return rng();
}

Provider::Provider(const hmc_host_services_t& host) : host_(host, "ucx") {}

void Provider::props(hmc_net_props_t& p) const {
  p.latency_us = latency_us_;
  p.bandwidth_gbps = bandwidth_gbps_;
  p.max_msg_size = kMaxMessage;
  if (p.struct_size >= offsetof(hmc_net_props_t, eager_limit_same_host) + sizeof(size_t))
    p.eager_limit_same_host = eager_limit_same_host_;
  if (p.struct_size >= offsetof(hmc_net_props_t, caps_absent) + sizeof(uint64_t)) p.caps_absent = caps_absent_;
  // Where shared memory carries same-host pairs, the receiver reads a rendezvous with one
  // memcpy from the sender's mapped segment (put.cpp: start_get), unless HMC_UCX_PUT=am
  // keeps every one-sided operation an active message.
  const bool gets = eager_limit_same_host_ > 0 && put_mode_ != PutMode::kAm;
  if (p.struct_size >= offsetof(hmc_net_props_t, rndv_get_max_same_host) + sizeof(size_t))
    p.rndv_get_max_same_host = gets ? kShmGetLimit : 0;
  if (p.struct_size >= offsetof(hmc_net_props_t, rndv_get_from_same_host) + sizeof(size_t))
    p.rndv_get_from_same_host = gets ? kShmGetFrom : 0;
}

void Provider::watch(int fd, uint64_t t, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = t;
  if (epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev) != 0) epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
}

Conn* Provider::find(void* handle) {
  auto it = conns_.find(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(handle)));
  return it == conns_.end() ? nullptr : it->second.get();
}

void Provider::unlock_and_wake(std::unique_lock<std::mutex>& lock) {
  bool wake = wake_;
  wake_ = false;
  lock.unlock();
  if (wake) host_.wake();
}

// Progresses the worker until idle (bounded), then does what its callbacks
// left for outside them: endpoint failures, messages in the inboxes, sends
// that waited for a put.
bool Provider::drive(bool until_idle) {
  bool moved = false;
  for (int i = 0; i < 256; ++i) {
    unsigned n = ucp_worker_progress(worker_);
    moved |= n != 0;
    std::vector<std::pair<ucp_ep_h, ucs_status_t>> errors;
    if (errors_pending_.load(std::memory_order_acquire)) {
      std::lock_guard lock(errors_mu_);
      errors.swap(errors_);
      errors_pending_.store(false, std::memory_order_relaxed);
    }
    bool more = !errors.empty() || !pending_.empty() || !broken_.empty();
    // Messages first: what arrived whole in the same progress as the peer's failure is
    // handed out in order before the failure drops the rest of the inbox.
    pending_scan_.clear();
    std::swap(pending_scan_, pending_);
    for (uint32_t id : pending_scan_) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      it->second->pending = false;
      pump(*it->second);
    }
    for (auto [ep, status] : errors) on_ep_error(ep, status);
    for (auto [id, status] : std::exchange(broken_, {})) {
      auto it = conns_.find(id);
      if (it != conns_.end()) lose(*it->second, status);
    }
    moved |= more;
    if ((n == 0 || !until_idle) && !more) break;
  }
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(*it);
    it = closing_.erase(it);
  }
  if (dead_rkeys_.empty() || !closing_.empty()) return moved;
  for (auto& [id, c] : conns_)
    if (c->puts > 0) return moved;
  for (ucp_rkey_h k : dead_rkeys_) ucp_rkey_destroy(k);
  dead_rkeys_.clear();
  return moved;
}

// A call that comes less than kLinger after the one before is the host polling. One
// after a longer gap is not: the host had stopped, and a waiter that was polling makes
// exactly such a call before a long sleep (core/progress.h), as is the call after idle().
// The thread, which may not look again for up to kLookMax, is told at once to take the
// worker over.
int Provider::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return HMC_PROV_OK;
  const auto now = Clock::now().time_since_epoch();
  const auto before = last_progress_;
  last_progress_ = now;
  // The call after a pass that moved counts as polling whatever the gap: that pass may
  // have copied for a while (a large message's fragments), and a waiter that saw something
  // move polls on before it sleeps (core/progress.cpp), so the gap that matters never
  // follows it. Its end is not stamped: a clock read is 16-34 ns on the VMs measured, on
  // the path of every message (docs/performance.md, "What is left to cut").
  const bool idle = idle_.load(std::memory_order_relaxed) && idle_.exchange(false);
  const bool polling = !idle && (moved_last_ || now - before < kLinger);
  if (polling) host_polled_.store(now.count(), std::memory_order_relaxed);
  const bool moved = drive(false);
  moved_last_ = moved;
  unlock_and_wake(lock);
  if (!polling && !thread_watches_.load()) kick_thread();
  return moved ? 1 : HMC_PROV_OK;
}

// The host says at once what the gap before its next call would say only after kLinger:
// the thread, which may not look again for up to kLookMax, arms the worker and wakes the
// host for what arrives from now on. The stamp is cleared before thread_watches_ is read,
// and the thread stores thread_watches_ before it reads the stamp again (run()), all four
// in one sequential order: either this call sees that the thread stopped watching and
// kicks it, or the thread sees the cleared stamp and takes the worker over at once.
void Provider::idle() {
  idle_.store(true, std::memory_order_relaxed);
  host_polled_.store(0);
  if (!thread_watches_.load()) kick_thread();
}

void Provider::note_host_call() {
  last_progress_ = Clock::now().time_since_epoch();
  host_polled_.store(last_progress_.count(), std::memory_order_relaxed);
}

void Provider::kick_thread() {
  uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;
}

// The thread: sleep until the worker or a socket has something, then work
// under mu_. Once woken it keeps progressing while traffic flows and for
// kLinger after (a stream of fragments would otherwise cost a wake-up each),
// unless the host is polling the worker itself. While the host polls (its
// last progress() less than kLinger ago) the thread leaves the worker alone:
// it does not arm it and takes the worker's fd out of its epoll set, so a
// message costs neither the sender a signal nor this side a thread wake-up
// (on two cores that doubled an 8 B round trip); it looks again from time to time,
// still serving the lifeline sockets, and once the host stopped polling it
// arms the worker and sleeps until something arrives. Its looks while the host
// polls come kLinger apart at first, twice as far each time up to kLookMax: every
// look takes a core from a rank for a context switch, and at every kLinger that
// added 1.2-1.5 us to the mean 8 B half round trip over tcp on two cores (the
// median unchanged, one round trip in ten 10 us slower). progress() tells the
// thread when the host stops, so a waiter that goes to sleep is not left for a look.
void Provider::run() {
  constexpr int kArmTries = 64;
  std::vector<epoll_event> events(32);
  std::vector<std::pair<uint64_t, uint32_t>> ready;
  auto look = kLinger;
  // How long an unarmed thread sleeps: kLinger, twice as long after each pass in which the
  // worker stayed BUSY and nothing moved, up to kLookMax (a worker stuck BUSY after a peer
  // died over shared memory cost a core at 40 % while a close waited out its 10 s).
  auto unarmed = kLinger;
  for (;;) {
    // The host still polls (or copies a put under mu_) and no socket spoke: nothing to do,
    // and no reason to take mu_ from the host's calls.
    const auto polled = Clock::duration(host_polled_.load(std::memory_order_relaxed));
    const bool watching_ucx = thread_watches_.load(std::memory_order_relaxed);
    const bool host_busy = host_inside_.load(std::memory_order_relaxed) > 0;
    if (ready.empty() && !watching_ucx && (host_busy || Clock::now().time_since_epoch() - polled < kLinger)) {
      const timespec wait{0, std::chrono::nanoseconds(look).count()};
      look = std::min(look * 2, kLookMax);
      wait_events(events, wait, ready);
      continue;  // stop_ comes with a write to the eventfd: ready, and handled below
    }
    bool host_polls = false;
    bool armed = false;  // the worker will signal its fd: the thread may sleep
    // A lifeline socket or listener that spoke is movement; the worker's fd is not (drive
    // says whether the worker moved), nor the host's kick: a worker stuck BUSY may keep its
    // fd readable, and a waiting host kicks after each of its sleeps (progress()).
    bool moved = std::any_of(ready.begin(), ready.end(), [](const auto& r) {
      const auto w = static_cast<Watch>(r.first >> 56);
      return w == kSocket || w == kListen;
    });
    {
      std::unique_lock lock(mu_);
      for (auto [t, ev] : ready) handle_event(t, ev);
      ready.clear();
      drop_strangers();
      for (auto last = Clock::now(); !stop_;) {
        const auto now = Clock::now();
        if (drive()) {
          last = now;
          moved = true;
        }
        const auto polled = Clock::duration(host_polled_.load(std::memory_order_relaxed));
        host_polls = now.time_since_epoch() - polled < kLinger;
        // Lingering pays off only where every fragment needs this side (shared
        // memory without cma); over tcp it exposed a crash in UCX 1.13 when two
        // workers of one process talk (docs/ucx.md). Backing off, it does not linger.
        if (peer_errors_ || now - last > kLinger || host_polls || (!moved && unarmed > kLinger)) break;
        unlock_and_wake(lock);
        std::this_thread::yield();
        lock.lock();
      }
      if (stop_) return;
      // BUSY: something came in while arming; progress and try again, but a bounded number
      // of times: after a peer died over shared memory the worker was seen to stay BUSY for
      // good, and this loop held mu_ against every call of the host. Unarmed, the thread
      // looks again after kLinger instead of sleeping. Backing off it tries once: 64 tries
      // per look, each with a pass over the worker, kept it at 10 % of a core (test_thread).
      const int tries = unarmed > kLinger ? 1 : kArmTries;
      for (int i = 0; !host_polls && !armed && i < tries; ++i) {
        armed = ucp_worker_arm(worker_) != UCS_ERR_BUSY;
        if (!armed) moved |= drive();
      }
      unlock_and_wake(lock);
    }
    unarmed = armed || moved || host_polls ? kLinger : std::min(unarmed * 2, kLookMax);
    // The worker's fd is watched only by a thread that is neither leaving the worker to a
    // polling host nor backing off from a worker it cannot arm (whose fd may stay readable
    // and would end every back-off sleep at once).
    const bool watch_ucx = !host_polls && unarmed == kLinger;
    if (watch_ucx != watching_ucx) {
      if (!watch_ucx) epoll_ctl(epoll_, EPOLL_CTL_DEL, ucx_fd_, nullptr);
      else watch(ucx_fd_, watch_tag(kUcx, 0), EPOLLIN);
      thread_watches_.store(watch_ucx);
      // Left to a polling host: the host may have stopped polling since host_polls was
      // read, and seen this thread still watching, so it did not kick it (idle(),
      // progress()). Read the stamp again now that the store is visible, and take the
      // worker over at once rather than after an unarmed sleep.
      const auto polled = Clock::duration(host_polled_.load());
      if (host_polls && Clock::now().time_since_epoch() - polled >= kLinger) continue;
    }
    if (!host_polls) look = kLinger;
    const timespec wait = armed ? timespec{1, 0} : timespec{0, std::chrono::nanoseconds(unarmed).count()};
    wait_events(events, wait, ready);
  }
}

// epoll_pwait2 (Linux 5.11) waits in microseconds. An older kernel, or a seccomp profile
// older than the call, refuses it (ENOSYS, EPERM): start() found that out, and the thread
// waits with epoll_wait in whole milliseconds, rounded up, instead.
void Provider::wait_events(std::vector<epoll_event>& events, const timespec& wait,
                           std::vector<std::pair<uint64_t, uint32_t>>& ready) {
  const int most = static_cast<int>(events.size());
  int n;
  if (fine_waits_) {
    n = epoll_pwait2(epoll_, events.data(), most, &wait, nullptr);
  } else {
    const int64_t ms = int64_t{wait.tv_sec} * 1000 + (wait.tv_nsec + 999'999) / 1'000'000;
    n = epoll_wait(epoll_, events.data(), most, static_cast<int>(ms));
  }
  for (int i = 0; i < n; ++i) {
    const uint64_t t = events[i].data.u64;  // epoll_event is packed: copy, do not bind
    const uint32_t ev = events[i].events;
    ready.emplace_back(t, ev);
  }
}

void Provider::handle_event(uint64_t t, uint32_t events) {
  const uint64_t id = t & ((uint64_t{1} << 56) - 1);
  switch (static_cast<Watch>(t >> 56)) {
    case kEvent: {
      uint64_t v;
      ssize_t ignored = read(event_fd_, &v, sizeof(v));
      (void)ignored;
      break;
    }
    case kUcx:
      break;  // the caller progresses the worker
    case kListen:
      for (auto& [k, l] : listeners_)
        if (reinterpret_cast<uintptr_t>(k) == id) handle_listener(*l);
      break;
    case kSocket: {
      auto it = conns_.find(static_cast<uint32_t>(id));
      if (it != conns_.end()) handle_socket(*it->second, events);
      break;
    }
  }
}

// ucp_init with the transports `tls` (empty: UCX_TLS or UCX's default).
int Provider::init_context(const std::string& tls, std::string& why) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    why = std::string("ucp_config_read: ") + ucs_status_string(s);
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  if (!tls.empty()) {
    if (ucs_status_t s = ucp_config_modify(config, "TLS", tls.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      why = "HMC_UCX_TLS: '" + tls + "' refused by UCX: " + ucs_status_string(s);
      return HMC_PROV_ERR_INVALID;
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    why = std::string("ucp_init failed (") + ucs_status_string(s) + "): no usable UCX transport for " +
          (tls.empty() ? "UCX_TLS" : "HMC_UCX_TLS=" + tls) + " (see ucx_info -d)";
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  return HMC_PROV_OK;
}

int Provider::start(std::string& why) {
  std::string tls, put_mode, ports;
  bool keep_cma = false;
  if (!host_.get_string(kParams[0], tls, why) || !host_.get_string(kParams[1], bind_addr_, why) ||
      !host_.get_string(kParams[2], ports, why) || !host_.get_bool(kParams[3], keep_cma, why) ||
      !host_.get_string(kParams[4], put_mode, why) ||
      !hmc_net::parse_port_range("HMC_UCX_PORT", ports.empty() ? "0" : ports, ports_, why)) {
    return HMC_PROV_ERR_INVALID;
  }
  if (put_mode == "auto" || put_mode.empty()) put_mode_ = PutMode::kAuto;
  else if (put_mode == "rma") put_mode_ = PutMode::kRma;
  else if (put_mode == "am") put_mode_ = PutMode::kAm;
  else {
    why = "HMC_UCX_PUT='" + put_mode + "': expected auto, rma or am";
    return HMC_PROV_ERR_INVALID;
  }
  if (int rc = init_context(tls, why)) return rc;
  auto names = transports(context_);
  names.erase("self");
  const std::set<std::string> shm = {"posix", "sysv", "cma", "xpmem", "knem"};
  bool has_tcp = names.contains("tcp"), has_rdma = false;
  for (const auto& n : names)
    has_rdma |= n.rfind("rc", 0) == 0 || n.rfind("ud", 0) == 0 || n.rfind("dc", 0) == 0;
  // Without tcp or verbs, UCX 1.13 has no peer failure handling (posix and sysv
  // lack it), and then a cma copy from a peer that died aborts this process.
  peer_errors_ = has_tcp || has_rdma;
  tcp_only_ = has_tcp && !has_rdma;
  rdma_ = has_rdma;
  if (!peer_errors_ && names.contains("cma") && !keep_cma) {
    names.erase("cma");
    std::string rest;
    for (const auto& n : names) rest += (rest.empty() ? "" : ",") + n;
    ucp_cleanup(context_);
    context_ = nullptr;
    if (rest.empty()) {
      why = "UCX offers only cma, which carries no messages (UCX_TLS)";
      return HMC_PROV_ERR_UNAVAILABLE;
    }
    host_.log(HMC_LOG_DEBUG, "no UCX transport with peer failure handling: leaving cma out (" + rest + ")");
    if (int rc = init_context(rest, why)) return rc;
  }
  for (const auto& n : names) transports_ += (transports_.empty() ? "" : ",") + n;
  bool has_shm = false;
  for (const auto& n : names) has_shm |= shm.contains(n);
  if (!has_shm && !has_tcp && !has_rdma) {
    why = "UCX selected no transport that reaches another process (" +
          std::string(tls.empty() ? "UCX_TLS" : "HMC_UCX_TLS=" + tls) + " gives only self)";
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  // Peers on this host talk over posix/sysv when UCX has them and no transport with peer
  // failure handling (endpoints in PEER mode use only lanes that can report a dead peer,
  // which posix and sysv cannot: with tcp in the list, the default included, every
  // endpoint is tcp). A message there is an active message that UCX moves in 8 KiB
  // fragments through a bounce buffer, while a put into memory from mem_alloc is one
  // memcpy: past 32 KiB the host's rendezvous wins even into malloc memory, where UCX
  // emulates the put (docs/ucx.md).
  if (!peer_errors_ && (names.contains("posix") || names.contains("sysv"))) eager_limit_same_host_ = kShmEagerLimit;
  // Cost-model inputs for the class of transport that serves the slowest peers
  // (docs/ucx.md has the measurements behind them).
  // Shared memory alone reaches no other host: path negotiation must not pick ucx for a
  // peer elsewhere (the endpoint would find no transport, and the job would fail where
  // tcp would have carried it).
  if (!has_tcp && !has_rdma) caps_absent_ = HMC_NET_CAP_REMOTE;
  if (has_rdma) {
    latency_us_ = 3, bandwidth_gbps_ = 12;
  } else if (has_tcp) {
    latency_us_ = 14, bandwidth_gbps_ = 1.5;  // UCX's tcp put_zcopy is slow: rendezvous pays
  } else {
    latency_us_ = 6, bandwidth_gbps_ = 8;
  }
  ucs_status_t s;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if ((s = ucp_worker_create(context_, &wp, &worker_)) != UCS_OK) {
    why = std::string("ucp_worker_create: ") + ucs_status_string(s);
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if ((s = ucp_worker_get_address(worker_, &addr, &addr_len)) != UCS_OK ||
      (s = ucp_worker_get_efd(worker_, &ucx_fd_)) != UCS_OK) {
    why = std::string("ucp worker address or event fd: ") + ucs_status_string(s);
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  worker_addr_.assign(reinterpret_cast<char*>(addr), reinterpret_cast<char*>(addr) + addr_len);
  ucp_worker_release_address(worker_, addr);
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kAmId;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  hp.arg = this;
  hp.cb = [](void* arg, const void* header, size_t header_len, void* data, size_t len,
             const ucp_am_recv_param_t* param) -> ucs_status_t {
    // Not ours (or a control message cut short): dropped.
    if (header_len != sizeof(Wire) && header_len != kMsgWire) return UCS_OK;
    Wire w{};
    std::memcpy(&w, header, header_len);
    if (header_len == kMsgWire && static_cast<Kind>(w.kind) != Kind::kMsg) return UCS_OK;
    return static_cast<Provider*>(arg)->on_am(w, data, len, param);
  };
  if ((s = ucp_worker_set_am_recv_handler(worker_, &hp)) != UCS_OK) {
    why = std::string("ucp_worker_set_am_recv_handler: ") + ucs_status_string(s);
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_ < 0 || event_fd_ < 0) {
    why = std::string("epoll/eventfd: ") + std::strerror(errno);
    return HMC_PROV_ERR_INTERNAL;
  }
  watch(event_fd_, watch_tag(kEvent, 0), EPOLLIN);
  watch(ucx_fd_, watch_tag(kUcx, 0), EPOLLIN);
  epoll_event probe{};
  const timespec now{0, 0};
  if (epoll_pwait2(epoll_, &probe, 1, &now, nullptr) < 0 && (errno == ENOSYS || errno == EPERM)) {
    fine_waits_ = false;
    host_.log(HMC_LOG_INFO, std::string("epoll_pwait2 refused (") + std::strerror(errno) +
                                "): the provider's thread waits in whole milliseconds");
  }
  next_conn_ = static_cast<uint32_t>(random64() % 1000000) + 1;
  {
    std::lock_guard lock(live_mu);
    live.insert(this);
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hmc-ucx");  // top -H, gdb: whose thread this is
    run();
  });
  host_.log(HMC_LOG_DEBUG, "ucx " + std::string(ucp_get_version_string()) + " transports " +
                               transports_ + ", worker address " + std::to_string(addr_len) + " bytes");
  return HMC_PROV_OK;
}

Provider::~Provider() {
  {
    std::lock_guard lock(live_mu);
    live.erase(this);
  }
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    kick_thread();
    thread_.join();
  }
  std::unique_lock lock(mu_);
  // Connections the host left open close as close_conn closes them: what was sent
  // (a send that completed may still sit in UCX's queue) goes out first, for 2 s at most.
  std::vector<uint32_t> ids;
  for (auto& [id, c] : conns_) ids.push_back(id);
  const auto cap = Clock::now() + std::chrono::seconds(2);
  for (uint32_t id : ids) close_locked(lock, conns_[id].get(), cap, true);
  for (auto& [k, l] : listeners_) close(l->fd);
  listeners_.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!closing_.empty() && std::chrono::steady_clock::now() < deadline) drive();
  // Closes that never ended (a peer stopped, not gone: nothing flushes, no error comes)
  // are handed back unfinished; UCX 1.13 aborts the process in ucp_worker_destroy on an
  // endpoint close request the user still holds.
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
  for (ucp_rkey_h k : dead_rkeys_) ucp_rkey_destroy(k);
  dead_rkeys_.clear();
  regions_.clear();  // the last user of a mapping unmaps it
  allocations_.clear();
  if (worker_) ucp_worker_destroy(worker_);
  for (Op* op : orphans_) delete op;  // no callback comes after the worker is gone
  orphans_.clear();
  if (context_) ucp_cleanup(context_);
  if (epoll_ >= 0) close(epoll_);
  if (event_fd_ >= 0) close(event_fd_);
}

// Fails everything pending on `c` and ends its endpoint and lifeline. The
// Conn stays in the table (later calls see the error) until close_conn.
void Provider::fail(Conn& c, int code, const std::string& why) {
  if (c.state == Conn::kFailed) return;
  c.state = Conn::kFailed;
  c.error = code;
  c.why = why;
  host_.log(code == HMC_PROV_ERR_CLOSED ? HMC_LOG_DEBUG : HMC_LOG_INFO, why);
  for (Recv& r : c.recvs) {
    if (r.op) r.op->recv = nullptr;
    if (r.req == nullptr) continue;  // close_locked ends it later
    if (!r.landed) r.req->fail(code, why);
    else if (r.rc == HMC_PROV_OK) r.req->complete(r.bytes);
    else r.req->fail(r.rc, r.why);
  }
  c.recvs.clear();
  c.assigned = 0;
  for (Op* op : c.held) {
    op->req->fail(code, why);
    delete op;
  }
  c.held.clear();
  for (auto& [id, p] : c.checking) p.req->fail(code, why);
  for (auto& [id, p] : c.am_puts) p.req->fail(code, why);
  // Those puts end here, not in put_finished: uncount them, or dead rkeys stay forever
  // (drive() frees them only while no connection has puts under way).
  c.puts -= std::min<size_t>(c.puts, c.checking.size() + c.am_puts.size());
  c.checking.clear();
  c.am_puts.clear();
  if (!peer_errors_ && code != HMC_PROV_ERR_CLOSED) {
    // Mode NONE: the shared endpoint stays open and UCX ends nothing that this connection
    // has under way with a peer that is gone (a rendezvous send waits for a fetch, a
    // flush for its puts). Sends and flushes fail now, as close_conn's retire does once
    // its wait is over (close_conn itself: CLOSED, left to that); their late callbacks
    // find no request. A get stays: UCX may still write its buffer.
    for (Op* op : c.ops)
      if (op->req != nullptr && (op->type == Op::kSend || op->type == Op::kFlush)) {
        op->req->fail(code, why);
        op->req = nullptr;
        if (op->type == Op::kFlush && c.puts > 0) --c.puts;
      }
  }
  keep_arrived(c, code == HMC_PROV_ERR_PEER_LOST);
  for (auto& [seq, m] : c.inbox) drop(m);
  c.inbox.clear();
  drop_keys(c);
  if (c.ep != nullptr && peer_errors_) {  // a shared endpoint (mode NONE) stays
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(c.ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
    else if (UCS_PTR_IS_ERR(r)) refused_close(c, UCS_PTR_STATUS(r));
  }
  c.ep = nullptr;
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  wake_later();
}

// Messages that arrived whole from a peer now lost stay for recv_msg, in order, up to
// the first one whose data UCP would still have to fetch (a rendezvous): that one and
// what follows are dropped. A message sent just before its sender finalized must not
// vanish because the sender's end was noticed first. Held UCP buffers become copies.
// Closing (any other code) keeps nothing.
void Provider::keep_arrived(Conn& c, bool keep) {
  size_t kept = 0;
  for (auto& m : c.unexpected) {
    if (!keep || m.rndv) break;
    if (m.held != nullptr) {
      m.copy.assign(static_cast<const char*>(m.held), m.len);
      ucp_am_data_release(worker_, m.held);
      m.held = nullptr;
    }
    ++kept;
  }
  for (size_t i = kept; i < c.unexpected.size(); ++i) drop(c.unexpected[i]);
  c.unexpected.erase(c.unexpected.begin() + static_cast<std::ptrdiff_t>(kept), c.unexpected.end());
}

// Ops still in flight complete with an error once the endpoint is closed;
// their callbacks must not find the Conn, so they forget it now.
void Provider::retire(std::unique_ptr<Conn> c) {
  // Only a close to a live peer leaves puts that may still land (landing()).
  const bool may_land = c->closing && !c->peer_gone;
  for (Op* op : c->ops) {
    orphans_.insert(op);
    op->conn = nullptr;
    op->recv = nullptr;
    if (!may_land) op->region = 0;  // no region has id 0
    // close_conn fails every pending request: a send or a put's flush that UCX still
    // holds (a stopped peer flushes nothing) ends now, and its late callback finds none.
    // A get is the exception: UCX may still write into its buffer, so it ends only when
    // UCX gives it back (on_op_done fails an orphan's request with CLOSED).
    if (op->req != nullptr && (op->type == Op::kSend || op->type == Op::kFlush)) {
      op->req->fail(HMC_PROV_ERR_CLOSED, "connection closed");
      op->req = nullptr;
    }
  }
  c->ops.clear();
}

// The endpoint is flushed, so that sends under way finish (UCX 1.13's tcp transport
// crashed now and then when one was cut off by a forced close), then closed by force,
// then the lifeline closes and the peer sees the end.
//
// Where the peer is gone (its lifeline ended; the host may learn that from its
// control plane before our thread reads the end-of-file) nothing can flush:
// the close is forced, and the wait for operations on the caller's buffers is
// short. UCX 1.13 never hands back a rendezvous receive whose sender died
// mid-transfer, even after a forced close; with the sender's process gone no
// data can land in the buffer any more, so the operation is left to UCX.
int Provider::close_conn(void* conn) {
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr || c->closing) return HMC_PROV_ERR_CLOSED;
  close_locked(lock, c, Clock::time_point::max());
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

bool Provider::look(std::unique_lock<std::mutex>& lock, Clock::time_point started) {
  const bool moved = drive();
  if (Clock::now() - started < std::chrono::milliseconds(1)) return moved;
  lock.unlock();
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  lock.lock();
  return moved;
}

// close_conn's work, under mu_ (`lock`); waits until `cap` at the latest. A wait past the
// first millisecond lets mu_ go between looks, so that a peer that flushes nothing (stopped,
// not gone) stalls only this call, not the other connections and the provider's thread.
void Provider::close_locked(std::unique_lock<std::mutex>& lock, Conn* c, Clock::time_point cap, bool force_stuck) {
  c->closing = true;  // nobody else frees it meanwhile (close_conn refuses, strangers skip it)
  ucp_ep_h ep = c->ep;
  const int fd = c->fd;
  bool gone = (c->state == Conn::kFailed && c->error == HMC_PROV_ERR_PEER_LOST) || (fd >= 0 && ended(fd));
  const bool failed = c->state == Conn::kFailed;
  c->peer_gone = gone || failed;  // landing(): only a live peer's puts still land
  c->ep = nullptr;  // fail() leaves both to us
  c->fd = -1;
  // Out of the thread's epoll set now: while the wait below lets mu_ go, a peer's end of
  // the lifeline would wake the thread again and again (level-triggered) for nothing.
  if (fd >= 0) epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  // Receives whose rendezvous data UCX still fetches into the caller's buffer end only
  // after the wait below for what uses the caller's buffers: ended in fail(), another
  // thread's test() would hand the buffer back while UCX still writes it. (From a peer
  // that is gone no more data comes: those end now.)
  std::vector<Request*> fetching;
  if (!gone && c->state != Conn::kFailed)
    for (Recv& r : c->recvs)
      if (r.op != nullptr && !r.landed) {
        r.op->recv = nullptr;
        r.op = nullptr;
        fetching.push_back(std::exchange(r.req, nullptr));
      }
  fail(*c, HMC_PROV_ERR_CLOSED, "connection closed");
  const auto deadline =
      std::min(cap, Clock::now() + (gone ? std::chrono::milliseconds(500) : std::chrono::seconds(10)));
  const auto started = Clock::now();
  auto look = [&] { return this->look(lock, started); };
  // A UCP request's end (UCS_INPROGRESS at the deadline); nullptr: done at once.
  auto settled = [&](void* r) {
    if (r == nullptr) return UCS_OK;
    if (!UCS_PTR_IS_PTR(r)) return UCS_PTR_STATUS(r);
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) look();
    return ucp_request_check_status(r);
  };
  // fini: an endpoint whose operations UCX still holds (a peer stopped, not gone, takes
  // nothing) never ends a flushing close, and UCX 1.13 aborts the process in
  // ucp_worker_destroy on such an endpoint (requests still on it). What has not moved by
  // `cap` is forced off.
  if (force_stuck && !gone && ep != nullptr) {
    while (!c->ops.empty() && Clock::now() < cap) look();
    if (!c->ops.empty()) {
      host_.log(HMC_LOG_WARN, "fini: " + c->peer + " took nothing for " + std::to_string(c->ops.size()) +
                                  " operation(s); " +
                                  (peer_errors_ ? "its endpoint is closed by force" : "they end with the worker"));
      gone = true;
      c->peer_gone = true;
    }
  }
  void* closing = nullptr;
  if (ep != nullptr) {
    // Flushed first, then closed by force: with peer failure handling on, UCX keeps the
    // transport endpoints of a flushing close while the connection lives (over tcp, one
    // socket per communicator ever made, on both sides). A flush that did not end (by the
    // deadline, or stalled: kFlushStall) is forced off too: a close left in flush mode
    // kept its requests, and ucp_worker_destroy then aborted the process at fini
    // (ucp_ep.c:437, seen after a peer's link went down). A shared endpoint (mode NONE) is
    // only flushed: what this connection sent arrives before its lifeline ends.
    if (!gone) {
      ucp_request_param_t none{};
      void* flushing = ucp_ep_flush_nbx(ep, &none);
      auto moved_at = Clock::now();
      const auto patience = moved_at - flush_stalled_at_ < kFlushStall ? Clock::duration::zero() : kFlushStall;
      while (UCS_PTR_IS_PTR(flushing) && ucp_request_check_status(flushing) == UCS_INPROGRESS &&
             Clock::now() < deadline) {
        if (look()) moved_at = Clock::now();
        else if (Clock::now() - moved_at >= patience) {
          flush_stalled_at_ = Clock::now();
          host_.log(HMC_LOG_INFO, "close_conn: the flush to " + c->peer + " moved nothing (kFlushStall); " +
                                      (peer_errors_ ? "its endpoint is closed by force" : "the connection closes without it"));
          break;
        }
      }
      if (UCS_PTR_IS_PTR(flushing)) ucp_request_free(flushing);
    }
    if (peer_errors_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      closing = ucp_ep_close_nbx(ep, &p);
      if (UCS_PTR_IS_ERR(closing)) refused_close(*c, UCS_PTR_STATUS(closing));
      settled(closing);
    }
  }
  // Nothing may touch the caller's buffers once we return: wait (bounded) for
  // UCP to give back every operation of this connection that uses them.
  auto uses_caller = [&] {
    for (Op* op : c->ops)
      if (op->type != Op::kControl && !op->bounce) return true;
    return false;
  };
  while (uses_caller() && Clock::now() < deadline) look();
  if (uses_caller())
    host_.log(gone ? HMC_LOG_DEBUG : HMC_LOG_WARN, "close_conn: UCX still holds operations of " + c->peer +
                                                       (gone ? " (the peer is gone)" : ""));
  for (Request* r : fetching) r->fail(HMC_PROV_ERR_CLOSED, "connection closed");
  if (UCS_PTR_IS_PTR(closing)) closing_.push_back(closing);
  // A peer that died while this close waited lands nothing more either (landing()).
  if (!c->peer_gone && fd >= 0 && ended(fd)) c->peer_gone = true;
  if (fd >= 0) close(fd);
  auto it = conns_.find(c->id);
  retire(std::move(it->second));
  conns_.erase(it);
}

// A close that UCX refused leaves its endpoint, and what it holds, until fini: say so.
void Provider::refused_close(const Conn& c, ucs_status_t s) {
  host_.log(HMC_LOG_WARN, "ucp_ep_close_nbx refused for " + c.peer + ": " + ucs_status_string(s) +
                              " (the endpoint stays until the context ends)");
}

void Provider::on_ep_error(ucp_ep_h ep, ucs_status_t status) {
  for (auto& [id, c] : conns_) {
    if (c->ep != ep) continue;
    lose(*c, status);
    return;
  }
}

// The peer counts as lost for the reason UCX gave.
void Provider::lose(Conn& c, ucs_status_t status) {
  fail(c, HMC_PROV_ERR_PEER_LOST, std::string("peer lost: ") + ucs_status_string(status) + " (" + c.peer + ")");
}

void Provider::on_error_callback(void* arg, ucp_ep_h ep, ucs_status_t status) {
  std::lock_guard lock(live_mu);
  if (!live.contains(arg)) return;
  auto* p = static_cast<Provider*>(arg);
  std::lock_guard errors(p->errors_mu_);
  p->errors_.emplace_back(ep, status);
  p->errors_pending_.store(true, std::memory_order_release);
}

}  // namespace hmc_ucx
