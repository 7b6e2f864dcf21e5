// Listeners, connect and accept: the lifeline sockets and their handshakes.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "provider.h"

namespace hmc_ucx {
namespace {
// How long a listener that ran out of descriptors stops accepting (the thread may sleep
// longer before it looks again: up to a second).
constexpr auto kAcceptRest = std::chrono::milliseconds(100);
}  // namespace

int Provider::listen(const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len,
                     void** listener) {
  if (addr == nullptr || addr_len == nullptr || listener == nullptr) return HMC_PROV_ERR_INVALID;
  const std::string hint = host_hint != nullptr ? host_hint : "";
  const std::string bind = !bind_addr_.empty() ? bind_addr_ : !hint.empty() ? hint : "0.0.0.0";
  // The first port of HMC_UCX_PORT's range that is free (one try for an ephemeral port).
  uint16_t port = 0;
  std::string why;
  int fd = -1;
  const auto in_use = [] { return errno == EADDRINUSE; };
  hmc_net::first_free_port(ports_, [&](uint16_t p) {
    port = p;  // listen_socket sets the ephemeral one it got
    return (fd = listen_socket(bind, port, why)) >= 0;
  }, in_use);
  if (fd < 0) {
    if (ports_.hi > ports_.lo && in_use()) why = hmc_net::ports_taken("HMC_UCX_PORT", ports_, bind);
    host_.log(HMC_LOG_WARN, "listen failed: " + why);
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  // Peers cannot dial 0.0.0.0: publish the hint, or loopback without one.
  std::string published = bind == "0.0.0.0" || bind == "::" ? (hint.empty() ? "127.0.0.1" : hint) : bind;
  published = format_addr(published, port);
  if (published.size() > addr_cap || published.size() > HMC_NET_ADDR_MAX) {
    close(fd);
    return HMC_PROV_ERR_INVALID;
  }
  auto l = std::make_unique<Listener>();
  l->fd = fd;
  l->addr = published;
  void* handle = l.get();
  std::unique_lock lock(mu_);
  watch(fd, watch_tag(kListen, reinterpret_cast<uintptr_t>(handle)), EPOLLIN);
  listeners_.emplace(handle, std::move(l));
  std::memcpy(addr, published.data(), published.size());
  *addr_len = published.size();
  *listener = handle;
  host_.log(HMC_LOG_DEBUG, "listening on " + published);
  return HMC_PROV_OK;
}

int Provider::close_listener(void* listener) {
  std::unique_lock lock(mu_);
  auto it = listeners_.find(listener);
  if (it == listeners_.end()) return HMC_PROV_ERR_CLOSED;
  close(it->second->fd);  // also leaves the epoll set
  // Connections it brought that nobody took yet: closed.
  for (auto c = conns_.begin(); c != conns_.end();) {
    if (c->second->listener != listener || c->second->closing) {
      ++c;
      continue;
    }
    fail(*c->second, HMC_PROV_ERR_CLOSED, "listener closed");
    retire(std::move(c->second));
    c = conns_.erase(c);
  }
  listeners_.erase(it);
  return HMC_PROV_OK;
}

void Provider::handle_listener(Listener& l) {
  for (;;) {
    int fd = accept4(l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the connection stays queued and the listener readable, so the
      // thread would try again at once, for ever. It rests for kAcceptRest first.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        host_.log(HMC_LOG_WARN, "accept on " + l.addr + " failed: " + std::strerror(errno) +
                                    "; the listener rests before it accepts again");
        epoll_ctl(epoll_, EPOLL_CTL_DEL, l.fd, nullptr);
        l.paused_until = Clock::now() + kAcceptRest;
      }
      return;
    }
    make_room(l);
    auto c = std::make_unique<Conn>();
    c->id = next_conn_++;
    c->cookie = random64();
    c->fd = fd;
    c->peer = peer_name(fd);
    c->listener = &l;
    watch(fd, watch_tag(kSocket, c->id), EPOLLIN | EPOLLRDHUP);
    conns_.emplace(c->id, std::move(c));
  }
}

int Provider::connect(const void* addr, size_t addr_len, const void* hello, size_t hello_len,
                      void** conn) {
  if (addr == nullptr || conn == nullptr || addr_len == 0 || addr_len > HMC_NET_ADDR_MAX ||
      hello_len > HMC_NET_HELLO_MAX || (hello == nullptr && hello_len > 0)) {
    return HMC_PROV_ERR_INVALID;
  }
  const std::string text(static_cast<const char*>(addr), addr_len);
  std::string why;
  int fd = connect_socket(text, why);
  if (fd < 0) {
    const bool invalid = errno == EINVAL || why.find("not a ucx address") != std::string::npos;
    host_.log(HMC_LOG_WARN, "connect: " + why);  // may change errno
    return invalid ? HMC_PROV_ERR_INVALID : HMC_PROV_ERR_REFUSED;
  }
  auto c = std::make_unique<Conn>();
  c->connector = true;
  c->fd = fd;
  c->peer = text;
  std::unique_lock lock(mu_);
  c->id = next_conn_++;
  c->cookie = random64();
  Handshake h;
  h.conn = c->id;
  h.cookie = c->cookie;
  h.hello.assign(static_cast<const char*>(hello), static_cast<const char*>(hello) + hello_len);
  h.worker = worker_addr_;
  c->out = encode(h);
  *conn = reinterpret_cast<void*>(static_cast<uintptr_t>(c->id));
  watch(fd, watch_tag(kSocket, c->id), EPOLLOUT | EPOLLIN | EPOLLRDHUP);
  conns_.emplace(c->id, std::move(c));
  return HMC_PROV_OK;
}

// Lifeline traffic: the handshake each way, then only the end of the peer.
void Provider::handle_socket(Conn& c, uint32_t events) {
  if (c.fd < 0) return;
  if (!c.out.empty() && (events & (EPOLLOUT | EPOLLIN))) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) c.out.erase(0, static_cast<size_t>(n));
  }
  bool eof = false;
  int err = 0;
  char buf[4096];
  // A handshake is at most its head, a hello and a worker address: a stranger that streams
  // more must not grow c.in without end, nor keep this loop (and mu_) to itself.
  constexpr size_t kMostHandshake = 32 + HMC_NET_HELLO_MAX + kMaxWorkerAddress;
  for (;;) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0 && c.state == Conn::kHandshake && c.in.size() + static_cast<size_t>(n) <= kMostHandshake) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    eof = n == 0;
    err = n < 0 ? errno : n > 0 ? EPROTO : 0;
    break;
  }
  if (c.state == Conn::kHandshake && c.ep != nullptr && !c.in.empty()) {
    // Acceptor: the connector's endpoint is up too. Only now may the host use the
    // connection (and perhaps exit): the connector is already done.
    c.state = Conn::kOpen;
    c.in.clear();
    mark_pending(c);
    wake_later();
  }
  if (c.state == Conn::kHandshake && c.ep == nullptr) {
    Handshake h;
    size_t used = 0;
    std::string why;
    int rc = decode(c.in, HMC_NET_HELLO_MAX, h, used, why);
    if (rc < 0) {
      host_.log(HMC_LOG_WARN, "refused a connection from " + c.peer + ": " + why);
      fail(c, HMC_PROV_ERR_REFUSED, why + " (" + c.peer + ")");
      return;
    }
    if (rc == 0) {
      c.peer_id = h.conn;
      c.peer_cookie = h.cookie;
      c.peer_worker = std::move(h.worker);
      c.in.clear();
      if (c.connector) {
        if (!finish_handshake(c)) return;
      } else {
        // Acceptor: the host checks the hello first. The worker address is handed to
        // UCX, which asserts on a malformed one, only once the host has vouched for the
        // sender by asking conn_status (a stranger's hello is refused and closed first).
        c.hello = std::move(h.hello);
        c.state = Conn::kChecking;
        auto it = listeners_.find(c.listener);
        if (it != listeners_.end()) it->second->ready.push_back(c.id);
        wake_later();
      }
    }
    if (c.state == Conn::kHandshake && (eof || err)) {
      fail(c, HMC_PROV_ERR_REFUSED,
           std::string(err ? std::strerror(err) : "closed during the handshake") + " (" + c.peer + ")");
      return;
    }
  }
  if (eof || err) {
    // Whatever reached this worker before the peer went is still handed out.
    drive();
    fail(c, HMC_PROV_ERR_PEER_LOST,
         "peer lost: " + std::string(eof ? "the peer closed the connection or exited" : std::strerror(err)) +
             " (" + c.peer + ")");
    return;
  }
  if (c.fd >= 0) watch(c.fd, watch_tag(kSocket, c.id), EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : uint32_t{EPOLLOUT}));
}

// Both sides: the endpoint to the peer's worker. The connector then is open, and one
// byte tells the acceptor so; the acceptor answers with its own worker address and
// waits for that byte.
bool Provider::finish_handshake(Conn& c) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(c.peer_worker.data());
  ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = on_error_callback;
  ep.err_handler.arg = this;
  if (!peer_errors_) ep.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
  ucs_status_t s = UCS_OK;
  auto shared = peer_errors_ ? shared_eps_.end() : shared_eps_.find(c.peer_worker);
  if (shared != shared_eps_.end()) c.ep = shared->second;
  else if (s = ucp_ep_create(worker_, &ep, &c.ep); s == UCS_OK && !peer_errors_) shared_eps_.emplace(c.peer_worker, c.ep);
  c.peer_worker.clear();
  if (s != UCS_OK) {
    c.ep = nullptr;
    fail(c, HMC_PROV_ERR_REFUSED, std::string("no UCX transport reaches ") + c.peer + ": " +
                                      ucs_status_string(s) + " (UCX transports here: " + transports_ + ")");
    return false;
  }
  if (c.connector) {
    c.state = Conn::kOpen;
    mark_pending(c);  // sends posted while connecting go now
    c.out = "R";
  } else {
    Handshake mine;
    mine.conn = c.id;
    mine.cookie = c.cookie;
    mine.worker = worker_addr_;
    c.out = encode(mine);
    c.state = Conn::kHandshake;
  }
  ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
  if (n > 0) c.out.erase(0, static_cast<size_t>(n));
  if (c.fd >= 0) watch(c.fd, watch_tag(kSocket, c.id), EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : uint32_t{EPOLLOUT}));
  wake_later();
  return true;
}

// Acceptor: the host's first conn_status (or, for a host that never asks, its first send
// or receive) says it checked the hello and keeps the connection: now the endpoint (a
// failure fails the connection).
void Provider::vouch(Conn& c) {
  if (c.state == Conn::kChecking) finish_handshake(c);
}

// At the limit of connections waiting (common/strangers.h), the oldest one `l` brought
// goes; one line a second (drop_strangers) says how many went so.
void Provider::make_room(Listener& l) {
  if (max_waiting_ == 0) max_waiting_ = hmc_net::max_waiting_connections();
  std::size_t waiting = 0;
  Conn* oldest = nullptr;
  for (auto& [id, c] : conns_) {
    if (c->listener != &l || c->closing) continue;
    ++waiting;
    if (oldest == nullptr || c->since < oldest->since) oldest = c.get();
  }
  if (waiting < max_waiting_ || oldest == nullptr) return;
  ++crowded_out_;
  fail(*oldest, HMC_PROV_ERR_CLOSED, "crowded out by newer connections");
  auto it = conns_.find(oldest->id);
  retire(std::move(it->second));
  conns_.erase(it);
}

// Listeners that rested after running out of descriptors listen again.
void Provider::resume_listeners() {
  const auto now = Clock::now();
  for (auto& [handle, l] : listeners_) {
    if (l->paused_until == Clock::time_point{} || now < l->paused_until) continue;
    l->paused_until = {};
    watch(l->fd, watch_tag(kListen, reinterpret_cast<uintptr_t>(handle)), EPOLLIN);
  }
}

// Connections the host never took: closed once they fail, after kHelloWait without a
// whole handshake (a genuine connector sends it at once), or after kUntakenWait with one
// (the host may be late to accept, up to its HMC_TIMEOUT). accept() skips ids that are gone.
void Provider::drop_strangers() {
  resume_listeners();
  const auto now = Clock::now();
  if (now - swept_ < std::chrono::seconds(1)) return;
  swept_ = now;
  if (crowded_out_ > 0)
    host_.log(HMC_LOG_WARN, "closed the " + std::to_string(crowded_out_) +
                                " oldest connection(s) waiting for their handshake or the host: more than " +
                                std::to_string(max_waiting_) + " came at once");
  crowded_out_ = 0;
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    const auto limit = c.state == Conn::kChecking ? hmc_net::kUntakenWait : hmc_net::kHelloWait;
    if (c.listener == nullptr || c.closing || (c.state != Conn::kFailed && now - c.since < limit)) {
      ++it;
      continue;
    }
    if (c.state != Conn::kFailed)
      host_.log(HMC_LOG_WARN, "dropped a connection from " + c.peer + ": " +
                                  (c.state == Conn::kChecking ? "not accepted" : "no handshake") + " within " +
                                  std::to_string(std::chrono::seconds(limit).count()) + " s");
    fail(c, HMC_PROV_ERR_CLOSED, "connection dropped");
    retire(std::move(it->second));
    it = conns_.erase(it);
  }
  for (auto& [handle, l] : listeners_)
    std::erase_if(l->ready, [this](uint32_t id) { return !conns_.contains(id); });
}

int Provider::conn_status(void* conn) {
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return HMC_PROV_ERR_CLOSED;
  vouch(*c);
  const int rc = c->state == Conn::kFailed ? c->error : c->state == Conn::kOpen ? HMC_PROV_OK : HMC_PROV_IN_PROGRESS;
  unlock_and_wake(lock);
  return rc;
}

int Provider::accept(void* listener, void** conn, void* hello, size_t hello_cap, size_t* hello_len) {
  if (conn == nullptr) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  auto it = listeners_.find(listener);
  if (it == listeners_.end()) return HMC_PROV_ERR_CLOSED;
  drop_strangers();
  auto& ready = it->second->ready;
  while (!ready.empty()) {
    uint32_t id = ready.front();
    Conn* c = find(reinterpret_cast<void*>(static_cast<uintptr_t>(id)));
    if (c == nullptr) {
      ready.pop_front();
      continue;
    }
    // Too small a buffer leaves the connection queued for a call with a larger one.
    if (c->hello.size() > hello_cap || (hello == nullptr && !c->hello.empty())) return HMC_PROV_ERR_INVALID;
    ready.pop_front();
    if (!c->hello.empty()) std::memcpy(hello, c->hello.data(), c->hello.size());
    if (hello_len != nullptr) *hello_len = c->hello.size();
    c->listener = nullptr;
    *conn = reinterpret_cast<void*>(static_cast<uintptr_t>(id));
    return HMC_PROV_OK;
  }
  return HMC_PROV_IN_PROGRESS;
}

}  // namespace hmc_ucx
