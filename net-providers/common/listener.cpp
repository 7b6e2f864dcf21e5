#include "common/listener.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/stream_provider.h"
#include "common/strangers.h"

namespace hmc_net {

Listener::Listener(StreamProvider& owner, Acceptor acceptor, std::string addr)
    : owner_(owner),
      acceptor_(std::move(acceptor)),
      addr_(std::move(addr)),
      retry_(owner.io()),
      sweep_(owner.io()),
      max_waiting_(max_waiting_connections()) {}

void Listener::start() {
  accept_next();
  sweep();
}

// Connections past their hello's time, or past the host's (they said a hello, and nobody
// took them: kUntakenWait), are closed; one line a second says how many, and how many were
// crowded out (accept_next).
void Listener::sweep() {
  sweep_.expires_after(std::chrono::seconds(1));
  sweep_.async_wait([weak = std::weak_ptr<Listener>(shared_from_this())](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<Connection>> late, untaken;
    for (const auto& [conn, since] : self->handshaking_)
      if (now - since >= kHelloWait) late.push_back(conn);
    for (auto& conn : late) self->handshaking_.erase(conn);  // first: closing may report the hello failed
    {
      std::lock_guard lock(self->mu_);
      while (!self->ready_.empty() && now - self->ready_.front().second >= kUntakenWait) {
        untaken.push_back(std::move(self->ready_.front().first));
        self->ready_.pop_front();
      }
    }
    for (auto& conn : late) conn->close(HMC_PROV_ERR_REFUSED, "no hello within 10 s");
    for (auto& conn : untaken) conn->close(HMC_PROV_ERR_REFUSED, "not accepted within 120 s");
    self->report(late.size(), untaken.size());
    self->sweep();
  });
}

void Listener::report(std::size_t late, std::size_t untaken) {
  auto& host = owner_.host();
  if (late > 0)
    host.log(HMC_LOG_WARN, "closed " + std::to_string(late) + " connection(s) on " + addr_ +
                               " that said no hello within " + std::to_string(kHelloWait.count()) + " s");
  if (untaken > 0)
    host.log(HMC_LOG_WARN, "closed " + std::to_string(untaken) + " connection(s) on " + addr_ +
                               " whose hello nobody took within " + std::to_string(kUntakenWait.count()) + " s");
  if (crowded_out_ > 0)
    host.log(HMC_LOG_WARN, "closed the " + std::to_string(crowded_out_) + " oldest connection(s) waiting on " +
                               addr_ + ": more than " + std::to_string(max_waiting_) + " came at once");
  crowded_out_ = 0;
}

// At the limit the oldest waiting connection goes: one without a hello first, else the
// oldest the host has not taken.
void Listener::make_room() {
  std::shared_ptr<Connection> out;
  if (!handshaking_.empty()) {
    auto oldest = std::min_element(handshaking_.begin(), handshaking_.end(),
                                   [](const auto& a, const auto& b) { return a.second < b.second; });
    out = oldest->first;
    handshaking_.erase(oldest);
  } else {
    std::lock_guard lock(mu_);
    if (ready_.empty()) return;
    out = std::move(ready_.front().first);
    ready_.pop_front();
  }
  ++crowded_out_;
  out->close(HMC_PROV_ERR_REFUSED, "crowded out by newer connections");
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
        if (waiting >= self->max_waiting_) self->make_room();
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
  auto it = handshaking_.find(conn);
  if (it == handshaking_.end()) return;  // crowded out or swept meanwhile
  const auto since = it->second;
  handshaking_.erase(it);
  if (!ok || closed_) return;
  {
    std::lock_guard lock(mu_);
    ready_.emplace_back(conn, since);
  }
  owner_.host().wake();
}

int Listener::pop(std::shared_ptr<Connection>& out, void* hello, size_t hello_cap,
                  size_t* hello_len) {
  std::lock_guard lock(mu_);
  if (ready_.empty()) return HMC_PROV_IN_PROGRESS;
  const std::vector<char>& h = ready_.front().first->hello();
  if (hello_len != nullptr) *hello_len = h.size();
  if (h.size() > hello_cap || (hello == nullptr && !h.empty())) return HMC_PROV_ERR_TRUNCATED;
  if (!h.empty()) std::memcpy(hello, h.data(), h.size());
  out = std::move(ready_.front().first);
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
  decltype(ready_) ready;
  {
    std::lock_guard lock(mu_);
    ready.swap(ready_);
  }
  for (auto& [c, since] : pending) c->close(HMC_PROV_ERR_CLOSED, "listener closed");
  for (auto& [c, since] : ready) c->close(HMC_PROV_ERR_CLOSED, "listener closed");
}

}  // namespace hmc_net
