// Connection setup, the caller-thread entry points and failure handling.
#include "common/connection.h"

#include <boost/asio/post.hpp>
#include <cctype>
#include <cstring>

#include "common/stream_provider.h"

namespace hmc_net {

Connection::Connection(StreamProvider& owner, Socket socket, std::string peer)
    : owner_(owner),
      socket_(std::move(socket)),
      peer_(std::move(peer)),
      stage_(new char[kStageSize]) {}

void Connection::queue_hello(const void* hello, size_t len) {
  OutItem item;
  item.hdr = make_header(FrameType::hello, len);
  if (len > 0) {
    item.owned.reset(new char[len]);
    std::memcpy(item.owned.get(), hello, len);
    item.data = item.owned.get();
  }
  std::lock_guard lock(mu_);
  send_q_.push_back(std::move(item));
}

void Connection::start_connect(const Endpoint& endpoint) {
  if (closed_) return;  // closed before the io thread got to it
  socket_.async_connect(endpoint, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (self->closed()) return;
    if (ec) {
      self->close(HMC_PROV_ERR_REFUSED, "connect to " + self->peer_ + " failed: " + ec.message());
      return;
    }
    self->owner_.on_open(*self);
    {
      std::lock_guard lock(self->mu_);
      self->state_.store(HMC_PROV_OK, std::memory_order_release);
      self->pump_armed_ = true;
    }
    self->start_reading();
    self->pump();
  });
}

void Connection::start_accepted(HelloHandler on_hello) {
  on_hello_ = std::move(on_hello);
  awaiting_hello_ = true;
  owner_.on_open(*this);
  state_.store(HMC_PROV_OK, std::memory_order_release);
  start_reading();
}

void Connection::kick_locked() {
  if (pump_armed_ || state_.load(std::memory_order_relaxed) != HMC_PROV_OK) return;
  pump_armed_ = true;
  boost::asio::post(owner_.io(), [self = shared_from_this()] { self->pump(); });
}

int Connection::send_msg(const void* buf, size_t len, Request* req) {
  OutItem item;
  item.hdr = make_header(FrameType::msg, len);
  item.data = static_cast<const char*>(buf);
  item.req = req;
  std::lock_guard lock(mu_);
  if (int s = state_.load(std::memory_order_relaxed); s < 0) return s;
  send_q_.push_back(std::move(item));
  kick_locked();
  return HMC_PROV_OK;
}

int Connection::put(const void* src, size_t len, const Rkey& rkey, uint64_t offset, bool direct,
                    Request* req) {
  OutItem item;
  item.req = req;
  if (direct) {
    item.direct = std::make_unique<DirectPut>();
    *item.direct = DirectPut{static_cast<const char*>(src), len, offset, rkey, 0};
  } else {
    item.hdr = make_header(FrameType::put, len);
    item.hdr.region = rkey.region;
    item.hdr.key = rkey.key;
    item.hdr.offset = offset;
    item.data = static_cast<const char*>(src);
  }
  std::lock_guard lock(mu_);
  if (int s = state_.load(std::memory_order_relaxed); s < 0) return s;
  send_q_.push_back(std::move(item));
  kick_locked();
  return HMC_PROV_OK;
}

int Connection::recv_msg(void* buf, size_t cap, Request* req) {
  PostedRecv r{static_cast<char*>(buf), cap, req};
  Message m;
  {
    std::lock_guard lock(mu_);
    if (unexpected_.empty()) {
      // Messages that arrived before a loss are still delivered; then the error.
      if (int s = state_.load(std::memory_order_relaxed); s < 0) return s;
      posted_.push_back(r);
      return HMC_PROV_OK;
    }
    m = std::move(unexpected_.front());
    unexpected_.pop_front();
  }
  deliver(r, m);
  return HMC_PROV_OK;
}

void Connection::deliver(const PostedRecv& r, Message& m) {
  if (m.len > r.cap) {
    r.req->fail(HMC_PROV_ERR_TRUNCATED, "message of " + std::to_string(m.len) +
                                            " bytes does not fit the posted buffer of " +
                                            std::to_string(r.cap) + " bytes");
  } else {
    if (m.len > 0) std::memcpy(r.buf, m.data.get(), m.len);
    r.req->complete(m.len);
  }
  owner_.host().wake();
}

void Connection::close(int code, const std::string& why) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.close(ignored);

  std::deque<OutItem> queued;
  std::deque<PostedRecv> posted;
  {
    std::lock_guard lock(mu_);
    state_.store(code, std::memory_order_release);
    why_ = why;
    queued.swap(send_q_);
    posted.swap(posted_);
    if (code == HMC_PROV_ERR_CLOSED) unexpected_.clear();
  }
  auto fail = [&](Request*& r) {
    if (r != nullptr) r->fail(code, why);
    r = nullptr;
  };
  for (auto& item : queued) fail(item.req);
  for (auto& r : posted) fail(r.req);
  fail(in_.recv);
  // batch_ stays allocated until the aborted write's handler runs: its buffers are in use.
  for (auto& item : batch_) fail(item.req);
  for (auto& a : await_ack_) fail(a.req);
  await_ack_.clear();
  if (direct_) fail(direct_->req);
  direct_.reset();
  ctrl_q_.clear();
  owner_.host().wake();

  if (on_hello_) {
    auto cb = std::move(on_hello_);
    on_hello_ = nullptr;
    cb(shared_from_this(), false);
  }
}

void Connection::lost(const boost::system::error_code& ec) {
  std::string what;
  if (ec == boost::asio::error::eof) {
    what = "peer closed the connection";
  } else {
    what = ec.message();
    if (!what.empty())
      what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  }
  close(HMC_PROV_ERR_PEER_LOST, "peer lost: " + what + " (" + peer_ + ")");
}

bool Connection::protocol_error(const std::string& what) {
  owner_.host().log(HMC_LOG_WARN, "protocol error from " + peer_ + ": " + what);
  close(HMC_PROV_ERR_PEER_LOST, "peer lost: protocol error: " + what + " (" + peer_ + ")");
  return false;
}

}  // namespace hmc_net
