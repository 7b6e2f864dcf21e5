// Connection setup, the caller-thread entry points and failure handling.
#include "common/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <boost/asio/post.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/stream_provider.h"

namespace hmc_net {

namespace {
// Largest message a caller thread writes itself; bigger ones go to the io
// thread at once (a caller should not spend long copying into the socket).
constexpr size_t kCallerWriteMax = 64 * 1024;
// Largest direct put a caller thread runs itself when nothing is queued: the
// caller waits for the copy anyway (rendezvous, see core/p2p.cpp), and an io
// thread copying beside polling callers competes with them for the cores. With
// 2 MiB-64 MiB puts handed to the io thread, `strace` showed two ranks' copies
// alternating instead of overlapping on 2 cores; run by the callers, all_to_all
// and all_gather of 16-64 MiB between two ranks took 10-30 % less (medians of
// 3-5 alternating runs; 4 ranks: 0-5 %). Messages are at most 1 GiB.
constexpr size_t kCallerPutMax = size_t{1} << 30;
// A direct put on the caller's thread goes in steps of this many bytes, each checking the
// target's descriptor of the region again: a deregistration waits for the step under way
// (common/put_fence.h), at most this much of a copy, and the put stops at the next.
constexpr uint64_t kCallerPutStep = uint64_t{4} << 20;
// Back-to-back sends with no message received in between are a stream: after
// kCallerStreak of them the rest go through the io thread, which writes up to
// 32 frames per sendmsg (per-message syscalls from the caller cut the rate of
// small messages by about 40 %). A pause of kCallerGap ends the stream.
constexpr unsigned kCallerStreak = 2;
constexpr auto kCallerGap = std::chrono::microseconds(20);
}  // namespace

Connection::Connection(StreamProvider& owner, Socket socket, std::string peer)
    : owner_(owner),
      socket_(std::move(socket)),
      fd_(socket_.native_handle()),
      peer_(std::move(peer)),
      tx_mode_(owner.uses_rings() ? TxMode::pending : TxMode::socket),
      stage_(new char[kStageSize]) {}

void Connection::make_ring() {
  if (owner_.uses_rings()) rx_ring_ = owner_.make_rx_ring();
}

void Connection::taken() { make_ring(); }

void Connection::queue_hello(const void* hello, size_t len) {
  make_ring();
  OutItem item;
  item.hdr = make_header(FrameType::hello, len);
  if (len > 0) {
    item.owned.reset(new char[len]);
    std::memcpy(item.owned.get(), hello, len);
    item.data = item.owned.get();
  }
  {
    std::lock_guard lock(mu_);
    send_q_.push_back(std::move(item));
  }
  queue_offer();
}

// This side's ring (or none): the connector's second frame, after its hello; the
// acceptor's first, once the host took the connection (resume_reading): a stranger gets
// no ring, and learns nothing of this process's memory.
void Connection::queue_offer() {
  if (tx_mode_ == TxMode::socket) return;  // the transport has no rings
  const RingOffer offer = rx_ring_ ? rx_ring_->offer() : RingOffer{};
  OutItem item;
  item.hdr = make_header(FrameType::ring, sizeof(offer));
  item.owned.reset(new char[sizeof(offer)]);
  std::memcpy(item.owned.get(), &offer, sizeof(offer));
  item.data = item.owned.get();
  std::lock_guard lock(mu_);
  send_q_.push_back(std::move(item));
  kick_locked();
}

void Connection::start_connect(const Endpoint& endpoint) {
  if (closed_) return;  // closed before the io thread got to it
  socket_.async_connect(endpoint, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (self->closed()) return;
    if (ec) {
      self->close(HMC_PROV_ERR_REFUSED, "connect to " + self->peer_ + " failed: " + ec.message());
      return;
    }
    std::string why;
    if (!self->owner_.on_open(*self, why)) {
      self->close(HMC_PROV_ERR_REFUSED, why);
      return;
    }
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
  std::string why;
  if (!owner_.on_open(*this, why)) {
    owner_.host().log(HMC_LOG_INFO, "refused a connection: " + why);
    close(HMC_PROV_ERR_REFUSED, why);
    return;
  }
  state_.store(HMC_PROV_OK, std::memory_order_release);
  start_reading();
}

void Connection::kick_locked() {
  // A caller holding the write side arms the pump itself when it lets go.
  if (pump_armed_ || caller_writing_ || state_.load(std::memory_order_relaxed) != HMC_PROV_OK)
    return;
  pump_armed_ = true;
  boost::asio::post(owner_.io(), [self = shared_from_this()] { self->pump(); });
}

int Connection::send_msg(const void* buf, size_t len, Request* req) {
  OutItem item;
  item.hdr = make_header(FrameType::msg, len);
  item.data = static_cast<const char*>(buf);
  item.req = req;
  const auto now = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  const int s = state_.load(std::memory_order_relaxed);
  if (s < 0) return s;
  if (tx_mode_ == TxMode::ring && send_q_.empty() && !direct_busy_ && !caller_putting_) {
    // Nothing ahead of it: straight into the peer's ring (see connection.h). What
    // does not fit is queued before the lock is let go (ring_bell may), so no other
    // message slips in between its records.
    const bool whole = ring_write_locked(item);
    const bool wrote = item.ring_started;
    if (!whole) {
      send_q_.push_back(std::move(item));
      kick_locked();
    }
    if (wrote && tx_ring_->reader_idle(SharedRing::now_ns())) ring_bell(lock);
    lock.unlock();
    if (whole) req->complete(len);
    return HMC_PROV_OK;
  }
  if (now - last_send_ > kCallerGap) caller_streak_ = 0;
  last_send_ = now;
  if (s == HMC_PROV_OK && tx_mode_ == TxMode::socket && len <= kCallerWriteMax &&
      send_q_.empty() && !pump_armed_ && !caller_writing_ && caller_streak_ < kCallerStreak) {
    // The writer is idle: write the frame from this thread (see connection.h).
    ++caller_streak_;
    const bool whole = caller_write(lock, item);
    lock.unlock();
    if (whole) req->complete(len);
    return HMC_PROV_OK;
  }
  send_q_.push_back(std::move(item));
  kick_locked();
  return HMC_PROV_OK;
}

// Writes `item` from this thread while the writer is idle (pump_armed_ and
// caller_writing_ false, lock held); what the socket did not take goes first in
// the queue. True when it took all.
bool Connection::caller_write(std::unique_lock<std::mutex>& lock, OutItem& item) {
  caller_writing_ = true;
  lock.unlock();
  const bool whole = send_now(item);
  lock.lock();
  caller_writing_ = false;
  if (!whole) send_q_.push_front(std::move(item));  // before anything queued meanwhile
  if (!send_q_.empty() || ctrl_waiting_ || bell_due_) kick_locked();
  ctrl_waiting_ = false;
  if (close_waiting_) writer_done_.notify_all();
  return whole;
}

// Tells the peer to read its ring (or that this side's ring has room again):
// from this thread when the writer is idle, else through the io thread.
void Connection::ring_bell(std::unique_lock<std::mutex>& lock) {
  if (state_.load(std::memory_order_relaxed) != HMC_PROV_OK) return;
  if (pump_armed_ || caller_writing_) {
    bell_due_ = true;
    kick_locked();
    return;
  }
  OutItem bell;
  bell.hdr = make_header(FrameType::bell, 0);
  caller_write(lock, bell);
}

// One non-blocking sendmsg of the whole frame from a caller thread holding the
// write side. True when the socket took all of it; otherwise item.skip says
// how much it took and the io thread sends the rest (and meets any error).
bool Connection::send_now(OutItem& item) {
  iovec iov[2] = {{&item.hdr, sizeof(FrameHeader)},
                  {const_cast<char*>(item.data), static_cast<size_t>(item.hdr.length)}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = item.hdr.length > 0 ? 2 : 1;
  ssize_t n;
  do {
    n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  item.skip = static_cast<uint64_t>(n);
  return item.skip == sizeof(FrameHeader) + item.hdr.length;
}

Connection::OutItem Connection::stream_put(const char* src, uint64_t len, const Rkey& rkey,
                                           uint64_t offset, Request* req) {
  OutItem item;
  item.hdr = make_header(FrameType::put, len);
  item.hdr.region = rkey.region;
  item.hdr.key = rkey.key;
  item.hdr.offset = offset;
  item.data = src;
  item.req = req;
  return item;
}

int Connection::put(const void* src, size_t len, const Rkey& rkey, uint64_t offset, bool direct,
                    Request* req) {
  const auto* data = static_cast<const char*>(src);
  OutItem item;
  if (direct) {
    item.req = req;
    item.direct = std::make_unique<DirectPut>();
    *item.direct = DirectPut{data, len, offset, rkey, 0};
  } else {
    item = stream_put(data, len, rkey, offset, req);
  }
  std::unique_lock lock(mu_);
  if (int s = state_.load(std::memory_order_relaxed); s < 0) return s;
  // Ring messages would overtake a put through the socket (shm maps rings only
  // where direct puts work).
  if (tx_mode_ == TxMode::ring && !direct) return HMC_PROV_ERR_UNSUPPORTED;
  // Direct puts wait for the peer's ring offer (put_ring).
  if (direct && len <= kCallerPutMax && tx_mode_ != TxMode::pending && send_q_.empty() &&
      !direct_busy_ && !caller_putting_) {
    caller_put(lock, *item.direct, req);
    return HMC_PROV_OK;
  }
  send_q_.push_back(std::move(item));
  kick_locked();
  return HMC_PROV_OK;
}

// Runs a direct put on this thread while nothing is queued (lock held; let go
// while copying). Messages sent meanwhile wait in the queue behind it.
void Connection::caller_put(std::unique_lock<std::mutex>& lock, DirectPut& put, Request* req) {
  caller_putting_ = true;
  lock.unlock();
  std::string why;
  int rc;
  do {
    rc = owner_.direct_put(*this, put, kCallerPutStep, why);
  } while (rc == kDirectMore);
  lock.lock();
  caller_putting_ = false;
  if (close_waiting_) writer_done_.notify_all();
  if (rc == kDirectUseStream && tx_mode_ != TxMode::ring &&
      state_.load(std::memory_order_relaxed) == HMC_PROV_OK) {
    send_q_.push_front(stream_put(put.src, put.len, put.rkey, put.offset, req));
    kick_locked();
    return;
  }
  if (!send_q_.empty()) kick_locked();
  const int state = state_.load(std::memory_order_relaxed);
  const std::string failed = state < 0 ? why_ : std::string();
  lock.unlock();
  if (rc == HMC_PROV_OK) {
    req->complete(put.len);
  } else if (rc == kDirectUseStream && state < 0) {
    req->fail(state, failed);  // the connection ended meanwhile: its reason, not the refusal
  } else if (rc == kDirectUseStream) {
    req->fail(HMC_PROV_ERR_UNSUPPORTED, "put to " + peer_ + ": direct write refused after the message ring was set up");
  } else {
    req->fail(rc, why);
  }
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
  deliver(r, m);  // before the request is handed out: no wake needed
  return HMC_PROV_OK;
}

void Connection::fail_truncated(const PostedRecv& r, uint64_t len) {
  r.req->fail(HMC_PROV_ERR_TRUNCATED, "message of " + std::to_string(len) +
                                          " bytes does not fit the posted buffer of " +
                                          std::to_string(r.cap) + " bytes");
}

Connection::PostedRecv Connection::match_posted(uint64_t len, bool& truncated) {
  PostedRecv r{nullptr, 0, nullptr};
  truncated = false;
  {
    std::lock_guard lock(mu_);
    caller_streak_ = 0;  // a reply: the next send may be written by its caller
    if (posted_.empty()) return r;
    r = posted_.front();
    posted_.pop_front();
  }
  if (len > r.cap) {
    fail_truncated(r, len);
    truncated = true;
  }
  return r;
}

bool Connection::settle(Message& m) {
  PostedRecv r{nullptr, 0, nullptr};
  {
    std::lock_guard lock(mu_);
    if (posted_.empty()) {
      unexpected_.push_back(std::move(m));
      return false;
    }
    r = posted_.front();
    posted_.pop_front();
  }
  deliver(r, m);
  return true;
}

void Connection::deliver(const PostedRecv& r, Message& m) {
  if (m.len > r.cap) {
    fail_truncated(r, m.len);
  } else {
    if (m.len > 0) std::memcpy(r.buf, m.data.get(), m.len);
    r.req->complete(m.len);
  }
}

void Connection::flush_wake() {
  if (!wake_due_) return;
  wake_due_ = false;
  owner_.host().wake();
}

bool Connection::peer_hung_up() {
  pollfd p{socket_.native_handle(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void Connection::close(int code, const std::string& why) {
  if (closed_) return;
  closed_ = true;
  // Messages the peer wrote before it was lost are still delivered, as from the socket.
  if (code != HMC_PROV_ERR_CLOSED) poll_ring(0, true);
  fail_ring_in(code, why);
  std::deque<OutItem> queued;
  std::deque<PostedRecv> posted;
  {
    std::unique_lock lock(mu_);
    state_.store(code, std::memory_order_release);
    why_ = why;
    // A caller writing a frame itself is done within one non-blocking sendmsg;
    // the descriptor stays open until then. It queues what it did not send.
    close_waiting_ = true;
    writer_done_.wait(lock, [this] { return !caller_writing_ && !caller_putting_; });
    close_waiting_ = false;
    queued.swap(send_q_);
    posted.swap(posted_);
    if (code == HMC_PROV_ERR_CLOSED) unexpected_.clear();
  }
  boost::system::error_code ignored;
  socket_.close(ignored);
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
  transport_.reset();
  wake_due_ = false;
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
