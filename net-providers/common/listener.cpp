#include "common/listener.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/stream_provider.h"

namespace hmc_net {
namespace {

// A connection that has not said hello (and been checked) within this is closed, and past
// handshaking_limit() waiting at once (for their hello, or for the host to take them) new
// ones are closed at once: a stranger holding connections open could otherwise use up the
// descriptors of the process (a peer says hello as soon as it connects). A connection
// reads nothing past its hello until the host took it (Connection::resume_reading).
constexpr auto kHelloWait = std::chrono::seconds(10);

// A quarter of the descriptors this process may open, and at least 256: a job large
// enough for a burst of peers to come near it needs a descriptor per peer anyway.
std::size_t handshaking_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1 << 16;
  return std::max<std::size_t>(256, r.rlim_cur / 4);
}

}  // namespace

Listener::Listener(StreamProvider& owner, Acceptor acceptor, std::string addr)
    : owner_(owner),
      acceptor_(std::move(acceptor)),
      addr_(std::move(addr)),
      retry_(owner.io()),
      sweep_(owner.io()),
      max_handshaking_(handshaking_limit()) {}

void Listener::start() {
  accept_next();
  sweep();
}

void Listener::sweep() {
  sweep_.expires_after(std::chrono::seconds(1));
  sweep_.async_wait([weak = std::weak_ptr<Listener>(shared_from_this())](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<Connection>> late;
    for (const auto& [conn, since] : self->handshaking_)
      if (now - since >= kHelloWait) late.push_back(conn);
    for (auto& conn : late) {  // out of the table first: closing may report the hello failed
      self->handshaking_.erase(conn);
      conn->close(HMC_PROV_ERR_REFUSED, "no hello within 10 s");
    }
    self->sweep();
  });
}

void Listener::accept_next() {
  acceptor_.async_accept(
      [self = shared_from_this()](const boost::system::error_code& ec, Connection::Socket socket) {
        if (self->closed_) return;
        if (!ec) close_on_exec(socket.native_handle());
        if (ec) {
          // Out of descriptors and the like: say so and try again shortly.
          self->owner_.host().log(HMC_LOG_WARN,
                                  "accept on " + self->addr_ + " failed: " + ec.message());
          self->retry_.expires_after(std::chrono::milliseconds(100));
          self->retry_.async_wait([self](const boost::system::error_code& e) {
            if (!e && !self->closed_) self->accept_next();
          });
          return;
        }
        std::size_t waiting = self->handshaking_.size();
        {
          std::lock_guard lock(self->mu_);
          waiting += self->ready_.size();  // said hello, not yet taken by the host
        }
        if (waiting >= self->max_handshaking_) {
          boost::system::error_code ignored;
          socket.close(ignored);
          return self->accept_next();
        }
        auto conn = std::make_shared<Connection>(self->owner_, std::move(socket), std::string());
        self->handshaking_.emplace(conn, std::chrono::steady_clock::now());
        std::weak_ptr<Listener> weak = self;
        conn->start_accepted([weak](const std::shared_ptr<Connection>& c, bool ok) {
          if (auto l = weak.lock()) l->on_hello(c, ok);
        });
        self->accept_next();
      });
}

void Listener::on_hello(const std::shared_ptr<Connection>& conn, bool ok) {
  handshaking_.erase(conn);
  if (!ok || closed_) return;
  {
    std::lock_guard lock(mu_);
    ready_.push_back(conn);
  }
  owner_.host().wake();
}

int Listener::pop(std::shared_ptr<Connection>& out, void* hello, size_t hello_cap,
                  size_t* hello_len) {
  std::lock_guard lock(mu_);
  if (ready_.empty()) return HMC_PROV_IN_PROGRESS;
  const std::vector<char>& h = ready_.front()->hello();
  if (hello_len != nullptr) *hello_len = h.size();
  if (h.size() > hello_cap || (hello == nullptr && !h.empty())) return HMC_PROV_ERR_TRUNCATED;
  if (!h.empty()) std::memcpy(hello, h.data(), h.size());
  out = std::move(ready_.front());
  ready_.pop_front();
  return HMC_PROV_OK;
}

void Listener::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_.cancel();
  sweep_.cancel();
  auto pending = std::move(handshaking_);
  handshaking_.clear();
  std::deque<std::shared_ptr<Connection>> ready;
  {
    std::lock_guard lock(mu_);
    ready.swap(ready_);
  }
  for (auto& [c, since] : pending) c->close(HMC_PROV_ERR_CLOSED, "listener closed");
  for (auto& c : ready) c->close(HMC_PROV_ERR_CLOSED, "listener closed");
}

}  // namespace hmc_net
