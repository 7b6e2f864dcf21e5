#include "common/stream_provider.h"

#include "common/tsan.h"

#include <fcntl.h>
#include <pthread.h>

#include <boost/asio/post.hpp>
#include <cstring>
#include <future>

namespace hmc_net {

StreamProvider::StreamProvider(const hmc_host_services_t& host, const char* name)
    : host_(host, name) {}

StreamProvider::~StreamProvider() { shutdown(); }

void StreamProvider::start() {
  work_.emplace(boost::asio::make_work_guard(io_));
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hmc-net-io");
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        host_.log(HMC_LOG_ERROR, std::string("io thread: unexpected error: ") + e.what());
      } catch (...) {
        host_.log(HMC_LOG_ERROR, "io thread: unexpected error");
      }
    }
  });
}

void StreamProvider::shutdown() {
  if (!thread_.joinable()) return;
  std::unordered_map<void*, std::shared_ptr<Connection>> conns;
  std::unordered_map<void*, std::shared_ptr<Listener>> listeners;
  {
    std::lock_guard lock(mu_);
    conns.swap(conns_);
    listeners.swap(listeners_);
    rings_.reset();
  }
  run_sync([&] {
    for (auto& [k, l] : listeners) l->close();
    for (auto& [k, c] : conns) c->close(HMC_PROV_ERR_CLOSED, "provider finalized");
  });
  for (auto& [k, l] : listeners) listener_closed(l->addr());
  for (auto& [k, c] : conns) put_fence_.closed({c->rx_ring(), c->peer_pid()});
  put_fence_.drain(host_);
  // Every socket is closed: run() returns once the aborted handlers ran.
  work_.reset();
  thread_.join();
}

void StreamProvider::run_sync(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) {
    fn();
    return;
  }
  std::promise<void> done;
  boost::asio::post(io_, [&] {
    try {
      fn();
    } catch (const std::exception& e) {
      host_.log(HMC_LOG_ERROR, std::string("io thread: unexpected error: ") + e.what());
    }
    done.set_value();
  });
  done.get_future().wait();
}

void StreamProvider::update_rings_locked() {
  auto list = std::make_shared<RingList>();
  for (auto& [k, c] : conns_)
    if (c->has_ring()) list->push_back(c);
  rings_ = std::move(list);
}

std::shared_ptr<const StreamProvider::RingList> StreamProvider::ring_snapshot() {
  std::lock_guard lock(mu_);
  return rings_;
}

int StreamProvider::progress() {
  const auto rings = ring_snapshot();
  if (!rings || rings->empty()) return HMC_PROV_OK;
  // Calls close together mean a caller is polling: stamp the rings (msg_ring.h). The
  // clock costs 20 ns on the 2-vCPU VM, a sixth of an empty poll, so a thread reads it on
  // every 4th call and reuses it between: a stamp is then a few calls older than the truth,
  // never newer, so a writer may ring a bell it did not need but never skips one.
  thread_local unsigned calls = 0;
  thread_local int64_t clock_ns = 0;
  if (calls++ % 4 == 0) clock_ns = SharedRing::now_ns();
  const int64_t now = clock_ns;
  const bool polling = now - last_progress_ns_.exchange(now) < SharedRing::kIdleNs;
  bool any = false;
  for (const auto& c : *rings) any |= c->poll_ring(polling ? now : 0);
  return any ? 1 : HMC_PROV_OK;
}

// The caller stops polling: its stamps, up to kIdleNs old, would keep writers from ringing.
// The call after this one is then not close to the one before, and stamps nothing. Between
// a writer's last write and its look at the stamp, and between the stamp's store here and
// the caller's next read of the ring, stand seq_cst fences: the writer rings, or the read
// finds what it wrote.
void StreamProvider::idle() {
  const auto rings = ring_snapshot();
  last_progress_ns_.store(0, std::memory_order_relaxed);
  if (rings)
    for (const auto& c : *rings) c->ring_idle();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

std::shared_ptr<Connection> StreamProvider::find_conn(void* conn) {
  std::lock_guard lock(mu_);
  auto it = conns_.find(conn);
  return it == conns_.end() ? nullptr : it->second;
}

int StreamProvider::direct_put(Connection&, DirectPut&, size_t, std::string&) {
  return kDirectUseStream;
}

void close_on_exec(int fd) {
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

int StreamProvider::listen(const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len,
                           void** listener) {
  if (addr == nullptr || addr_len == nullptr || listener == nullptr) return HMC_PROV_ERR_INVALID;
  Acceptor acceptor(io_);
  std::string published;
  std::string why;
  if (int rc = open_listener(host_hint != nullptr ? host_hint : "", acceptor, published, why)) {
    host_.log(HMC_LOG_WARN, "listen failed: " + why);
    return rc;
  }
  close_on_exec(acceptor.native_handle());
  if (published.size() > addr_cap || published.size() > HMC_NET_ADDR_MAX) {
    host_.log(HMC_LOG_WARN, "listen: address '" + published + "' does not fit the caller's buffer");
    boost::system::error_code ignored;
    acceptor.close(ignored);
    listener_closed(published);
    return HMC_PROV_ERR_INVALID;
  }
  auto l = std::make_shared<Listener>(*this, std::move(acceptor), published);
  {
    std::lock_guard lock(mu_);
    listeners_.emplace(l.get(), l);
  }
  boost::asio::post(io_, [l] { l->start(); });
  std::memcpy(addr, published.data(), published.size());
  *addr_len = published.size();
  *listener = l.get();
  host_.log(HMC_LOG_DEBUG, "listening on " + published);
  return HMC_PROV_OK;
}

int StreamProvider::close_listener(void* listener) {
  std::shared_ptr<Listener> l;
  {
    std::lock_guard lock(mu_);
    auto it = listeners_.find(listener);
    if (it == listeners_.end()) return HMC_PROV_ERR_CLOSED;
    l = std::move(it->second);
    listeners_.erase(it);
  }
  run_sync([&] { l->close(); });
  listener_closed(l->addr());
  return HMC_PROV_OK;
}

int StreamProvider::connect(const void* addr, size_t addr_len, const void* hello, size_t hello_len,
                            void** conn) {
  if (addr == nullptr || conn == nullptr || addr_len == 0 || addr_len > HMC_NET_ADDR_MAX ||
      hello_len > HMC_NET_HELLO_MAX || (hello == nullptr && hello_len > 0)) {
    return HMC_PROV_ERR_INVALID;
  }
  std::string text(static_cast<const char*>(addr), addr_len);
  Socket socket(io_);
  Endpoint endpoint;
  std::string why;
  if (int rc = open_socket(text, socket, endpoint, why)) {
    host_.log(HMC_LOG_WARN, "connect: " + why);
    return rc;
  }
  close_on_exec(socket.native_handle());
  auto c = std::make_shared<Connection>(*this, std::move(socket), text);
  c->queue_hello(hello, hello_len);
  {
    std::lock_guard lock(mu_);
    conns_.emplace(c.get(), c);
    if (c->has_ring()) update_rings_locked();
  }
  boost::asio::post(io_, [c, endpoint] { c->start_connect(endpoint); });
  *conn = c.get();
  return HMC_PROV_OK;
}

int StreamProvider::conn_status(void* conn) {
  auto c = find_conn(conn);
  return c ? c->status() : HMC_PROV_ERR_CLOSED;
}

int StreamProvider::accept(void* listener, void** conn, void* hello, size_t hello_cap,
                           size_t* hello_len) {
  if (conn == nullptr) return HMC_PROV_ERR_INVALID;
  std::shared_ptr<Listener> l;
  {
    std::lock_guard lock(mu_);
    auto it = listeners_.find(listener);
    if (it == listeners_.end()) return HMC_PROV_ERR_CLOSED;
    l = it->second;
  }
  std::shared_ptr<Connection> c;
  int rc = l->pop(c, hello, hello_cap, hello_len);
  if (rc != HMC_PROV_OK) return rc;
  c->taken();
  {
    std::lock_guard lock(mu_);
    conns_.emplace(c.get(), c);
    if (c->has_ring()) update_rings_locked();
  }
  boost::asio::post(io(), [c] { c->resume_reading(); });
  *conn = c.get();
  return HMC_PROV_OK;
}

int StreamProvider::close_conn(void* conn) {
  std::shared_ptr<Connection> c;
  {
    std::lock_guard lock(mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end()) return HMC_PROV_ERR_CLOSED;
    c = std::move(it->second);
    // Before it leaves conns_: a deregistration meanwhile finds a step of the peer's
    // under way in one or the other (put_fence.h). No step begins after this.
    put_fence_.closed({c->rx_ring(), c->peer_pid()});
    conns_.erase(it);
    if (c->has_ring()) update_rings_locked();
  }
  // On the io thread, so no read or write is touching a user buffer afterwards.
  run_sync([&] { c->close(HMC_PROV_ERR_CLOSED, "connection closed"); });
  return HMC_PROV_OK;
}

int StreamProvider::send_msg(void* conn, const void* buf, size_t len, void** req) {
  if (req == nullptr || (buf == nullptr && len > 0) || len > kMaxMessage)
    return HMC_PROV_ERR_INVALID;
  auto c = find_conn(conn);
  if (!c) return HMC_PROV_ERR_CLOSED;
  Request* r = requests_.create();
  if (int rc = c->send_msg(buf, len, r)) {
    requests_.discard(r);
    return rc;
  }
  *req = r;
  return HMC_PROV_OK;
}

int StreamProvider::recv_msg(void* conn, void* buf, size_t cap, void** req) {
  if (req == nullptr || (buf == nullptr && cap > 0)) return HMC_PROV_ERR_INVALID;
  auto c = find_conn(conn);
  if (!c) return HMC_PROV_ERR_CLOSED;
  Request* r = requests_.create();
  if (int rc = c->recv_msg(buf, cap, r)) {
    requests_.discard(r);
    return rc;
  }
  *req = r;
  return HMC_PROV_OK;
}

int StreamProvider::reg_mem(void* ptr, size_t bytes, int mem_kind, void** mr) {
  if (mem_kind != HMC_MEM_HOST) return HMC_PROV_ERR_UNSUPPORTED;
  if (mr == nullptr || (ptr == nullptr && bytes > 0)) return HMC_PROV_ERR_INVALID;
  *mr = regions_.add(ptr, bytes, find_file(ptr, bytes));
  return HMC_PROV_OK;
}

int StreamProvider::dereg_mem(void* mr) {
  RegionInfo gone;
  if (!regions_.remove(mr, &gone)) return HMC_PROV_ERR_INVALID;
  // A peer's single-copy put that checked the key before it was cleared ends first.
  if (uses_rings()) {
    put_fence_.wait(gone.id, rings_marking(gone.id), host_);
    tsan_acquire(gone.ptr);
  }
  return HMC_PROV_OK;
}

std::vector<PutFence::Ring> StreamProvider::rings_marking(uint64_t id) {
  PutFence::after_clear();
  std::vector<PutFence::Ring> out;
  std::lock_guard lock(mu_);
  for (auto& [k, c] : conns_) {
    const auto& ring = c->rx_ring();
    if (ring && PutFence::marks(*ring, id)) out.push_back({ring, c->peer_pid()});
  }
  return out;
}

int StreamProvider::pack_rkey(void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len) {
  RegionInfo info;
  if (!regions_.info(mr, info)) return HMC_PROV_ERR_INVALID;
  if (rkey_len != nullptr) *rkey_len = sizeof(Rkey);
  if (rkey == nullptr || rkey_cap < sizeof(Rkey)) return HMC_PROV_ERR_INVALID;
  Rkey k{};
  k.magic = rkey_magic();
  k.version = kRkeyVersion;
  k.region = info.id;
  k.key = info.key;
  k.length = info.len;
  k.file_fd = -1;
  k.desc_fd = -1;
  fill_rkey(k, info);
  std::memcpy(rkey, &k, sizeof(k));
  return HMC_PROV_OK;
}

int StreamProvider::put(void* conn, const void* src, size_t len, const void* rkey, size_t rkey_len,
                        uint64_t offset, void** req) {
  if (req == nullptr || (src == nullptr && len > 0)) return HMC_PROV_ERR_INVALID;
  Rkey k;
  if (!unpack_rkey(rkey, rkey_len, rkey_magic(), k)) return HMC_PROV_ERR_INVALID;
  // Early refusal from the key's length; the target checks again against its table.
  if (offset > k.length || len > k.length - offset) return HMC_PROV_ERR_OUT_OF_BOUNDS;
  auto c = find_conn(conn);
  if (!c) return HMC_PROV_ERR_CLOSED;
  Request* r = requests_.create();
  if (int rc = c->put(src, len, k, offset, use_direct(*c), r)) {
    requests_.discard(r);
    return rc;
  }
  *req = r;
  return HMC_PROV_OK;
}

int StreamProvider::test(void* req, int* done, size_t* bytes, char* message, size_t message_cap) {
  return requests_.test(req, done, bytes, message, message_cap);
}

}  // namespace hmc_net
