// The writer: one scatter/gather write at a time, FIFO, user buffers in place.
//
// pump() runs on the io thread whenever something may be writable: after a
// caller queued work (kick_locked), after a write completed, after the reader
// queued an ack/nak. Direct puts at the head of the queue run first, in steps,
// so a large single-copy put does not stall the other connections for long.
// The io thread writes only while it owns the write side (pump_armed_); see
// connection.h for the caller threads' own writes.
#include <sys/socket.h>
#include <sys/uio.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "common/connection.h"
#include "common/stream_provider.h"

namespace hmc_net {

namespace {
constexpr size_t kMaxBatch = 32;                    // frames per write (64 iovecs)
constexpr size_t kDirectBudget = size_t{64} << 20;  // direct-put bytes per pump
constexpr int kWritesPerTurn = 16;                  // sendmsg calls before yielding
}  // namespace

void Connection::pump() {
  if (closed() || writing_) return;
  {
    // A pump posted before an inline one (queue_ctrl) emptied the queue and let the
    // write side go: a caller may own it now, and the io thread must not write too.
    std::lock_guard lock(mu_);
    if (!pump_armed_) return;
  }
  pump_turn();
  flush_wake();
}

void Connection::pump_turn() {
  try {
    size_t budget = kDirectBudget;
    for (;;) {
      if (!direct_) {
        std::lock_guard lock(mu_);
        if (caller_putting_) break;  // the queue waits behind it; it kicks when done
        if (tx_mode_ == TxMode::ring) wake_due_ |= fill_ring_locked();
        if (!send_q_.empty() && send_q_.front().direct && tx_mode_ != TxMode::pending) {
          direct_ = std::make_unique<OutItem>(std::move(send_q_.front()));
          send_q_.pop_front();
          direct_busy_ = true;  // messages behind it wait (connection.h)
        }
      }
      if (!direct_) break;
      if (!run_direct(budget) || closed()) return;
    }
    write_batch();
  } catch (const std::bad_alloc&) {
    close(HMC_PROV_ERR_NO_MEMORY, "out of memory while sending to " + peer_);
  } catch (const std::exception& e) {
    close(HMC_PROV_ERR_INTERNAL, std::string("internal error while sending: ") + e.what());
  }
}

// One step of the direct put at the head. False when it yielded (a pump is posted).
bool Connection::run_direct(size_t& budget) {
  if (budget == 0) {
    boost::asio::post(owner_.io(), [self = shared_from_this()] { self->pump(); });
    return false;
  }
  DirectPut& d = *direct_->direct;
  const uint64_t before = d.done;
  std::string why;
  int rc = owner_.direct_put(*this, d, budget, why);
  const uint64_t moved = d.done - before;
  budget = moved >= budget ? 0 : budget - static_cast<size_t>(moved);
  if (rc == kDirectMore) return true;
  std::unique_lock lock(mu_);
  direct_busy_ = false;
  if (rc == kDirectUseStream && tx_mode_ == TxMode::ring) {
    // Messages in the ring would overtake the data on the socket.
    rc = HMC_PROV_ERR_UNSUPPORTED;
    why = "put to " + peer_ + ": direct write refused after the message ring was set up";
  }
  if (rc == kDirectUseStream) {
    // Same place in the queue, now as a socket put (target checks and acks).
    send_q_.push_front(stream_put(d.src, d.len, d.rkey, d.offset, direct_->req));
    direct_.reset();
    return true;
  }
  lock.unlock();
  Request* req = direct_->req;
  const uint64_t len = d.len;
  direct_.reset();
  if (rc == HMC_PROV_OK) {
    req->complete(len);
  } else {
    req->fail(rc, why);
  }
  wake_due_ = true;
  return true;
}

void Connection::write_batch() {
  batch_.clear();
  bufs_.clear();
  {
    std::lock_guard lock(mu_);
    // A frame that a caller's sendmsg wrote in part (caller_write puts it first in the
    // queue) goes on before anything else: no other frame may come between its bytes.
    if (!send_q_.empty() && send_q_.front().skip != 0) {
      batch_.push_back(std::move(send_q_.front()));
      send_q_.pop_front();
    }
    // Control frames (acks, naks) then overtake whatever else is queued.
    while (!ctrl_q_.empty() && batch_.size() < kMaxBatch) {
      batch_.push_back(std::move(ctrl_q_.front()));
      ctrl_q_.pop_front();
    }
    // Socket frames; messages go only when this side sends them through the socket
    // and no caller runs a put ahead of them. In ring mode the frames here are
    // bells and offers, which need no order against the ring.
    for (;;) {
      if (tx_mode_ == TxMode::ring && !caller_putting_) wake_due_ |= fill_ring_locked();
      if (send_q_.empty() || batch_.size() >= kMaxBatch || send_q_.front().direct ||
          (is_msg(send_q_.front()) && (tx_mode_ != TxMode::socket || caller_putting_))) {
        break;
      }
      batch_.push_back(std::move(send_q_.front()));
      send_q_.pop_front();
    }
    if (bell_due_ && batch_.size() < kMaxBatch) {  // else in the next batch
      bell_due_ = false;
      OutItem bell;
      bell.hdr = make_header(FrameType::bell, 0);
      batch_.push_back(std::move(bell));
    }
    if (batch_.empty()) {
      pump_armed_ = false;
      return;
    }
  }
  for (OutItem& item : batch_) {
    if (item.hdr.type == static_cast<uint16_t>(FrameType::put)) {
      // Await the ack from now on: it can only come after these bytes are out.
      item.hdr.seq = next_seq_++;
      await_ack_.push_back(AwaitAck{item.req, item.hdr.length, item.hdr.seq});
      item.req = nullptr;
    }
    // skip: what a caller's own sendmsg already wrote of this frame.
    uint64_t skip = item.skip;
    if (skip < sizeof(FrameHeader)) {
      bufs_.emplace_back(reinterpret_cast<const char*>(&item.hdr) + skip,
                         sizeof(FrameHeader) - skip);
      skip = 0;
    } else {
      skip -= sizeof(FrameHeader);
    }
    if (item.hdr.length > skip) bufs_.emplace_back(item.data + skip, item.hdr.length - skip);
  }
  write_index_ = 0;
  write_offset_ = 0;
  writing_ = true;
  write_more();
}

// Sends as much of bufs_ as the socket takes, one sendmsg per call over every
// remaining buffer (asio's async_write would cut it into 64 KiB writes), and
// waits for writability only when the kernel's buffer is full.
void Connection::write_more() {
  iovec iov[2 * kMaxBatch];
  for (int turn = 0;; ++turn) {
    if (turn == kWritesPerTurn) {  // let the other connections (and our reader) in
      boost::asio::post(owner_.io(), [self = shared_from_this()] {
        if (!self->closed()) self->write_more();
      });
      return;
    }
    size_t count = 0;
    for (size_t i = write_index_; i < bufs_.size(); ++i) {
      const size_t skip = i == write_index_ ? write_offset_ : 0;
      iov[count].iov_base = const_cast<char*>(static_cast<const char*>(bufs_[i].data()) + skip);
      iov[count].iov_len = bufs_[i].size() - skip;
      ++count;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        socket_.async_wait(Socket::wait_write,
                           [self = shared_from_this()](const boost::system::error_code& ec) {
                             if (self->closed()) return;
                             if (ec) {
                               self->on_written(ec);
                             } else {
                               self->write_more();
                             }
                           });
        return;
      }
      on_written(boost::system::error_code(errno, boost::system::system_category()));
      return;
    }
    auto left = static_cast<size_t>(n);
    while (write_index_ < bufs_.size() && left >= bufs_[write_index_].size() - write_offset_) {
      left -= bufs_[write_index_].size() - write_offset_;
      ++write_index_;
      write_offset_ = 0;
    }
    write_offset_ += left;
    if (write_index_ == bufs_.size()) {
      on_written({});
      return;
    }
  }
}

void Connection::on_written(const boost::system::error_code& ec) {
  if (!closed() && ec) {
    read_rest();  // writing_ still set: what it handles queues no write
    if (!closed()) lost(ec);
  }
  writing_ = false;
  if (closed()) {
    batch_.clear();  // requests were failed by close()
    return;
  }
  for (OutItem& item : batch_) {
    if (item.req != nullptr) {
      item.req->complete(item.hdr.length);
      wake_due_ = true;
    }
  }
  batch_.clear();
  pump();  // wakes the host for these too
}

void Connection::queue_ctrl(FrameHeader h, std::string text) {
  OutItem item;
  item.hdr = h;
  item.hdr.length = text.size();
  if (!text.empty()) {
    item.owned.reset(new char[text.size()]);
    std::memcpy(item.owned.get(), text.data(), text.size());
    item.data = item.owned.get();
  }
  ctrl_q_.push_back(std::move(item));
  {
    std::lock_guard lock(mu_);
    if (caller_writing_) {  // that caller arms the pump when it is done
      ctrl_waiting_ = true;
      return;
    }
    pump_armed_ = true;
  }
  pump();
}

}  // namespace hmc_net
