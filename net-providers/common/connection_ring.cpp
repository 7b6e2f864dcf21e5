// The message rings of a connection (msg_ring.h): writing this side's messages
// into the peer's ring, and reading the peer's out of this side's.
#include <boost/asio/post.hpp>
#include <cstring>

#include "common/connection.h"
#include "common/stream_provider.h"

namespace hmc_net {

bool Connection::is_msg(const OutItem& item) const {
  return !item.direct && item.hdr.type == static_cast<uint16_t>(FrameType::msg);
}

// The peer's offer arrived (io thread): this side's messages take the ring from
// now on if it can be mapped and carries messages, else the socket. Direct puts,
// held until now, may run (they mark their steps in the ring).
void Connection::on_offer() {
  auto ring = owner_.map_peer_ring(*this, offer_in_);
  std::lock_guard lock(mu_);
  tx_ring_ = std::move(ring);
  tx_mode_ = tx_ring_ && tx_ring_->carries_messages() ? TxMode::ring : TxMode::socket;
  if (!send_q_.empty()) kick_locked();
}

// Writes what is left of the message `item` into the peer's ring, a record at a
// time (mu_ held). True when all of it is there.
bool Connection::ring_write_locked(OutItem& item) {
  while (!item.ring_started || item.ring_done < item.hdr.length) {
    if (!tx_ring_->write(item.data, item.hdr.length, item.ring_done)) return false;
    item.ring_started = true;
  }
  return true;
}

// Moves the messages at the head of the queue into the peer's ring (mu_ held),
// completing them; when the ring is full, asks the peer for a bell. True when
// a request completed.
bool Connection::fill_ring_locked() {
  bool completed = false;
  bool wrote = false;
  while (!send_q_.empty() && is_msg(send_q_.front())) {
    OutItem& item = send_q_.front();
    const uint64_t before = item.ring_done;
    const bool started = item.ring_started;
    if (ring_write_locked(item)) {
      item.req->complete(item.hdr.length);
      send_q_.pop_front();
      completed = wrote = true;
      continue;
    }
    wrote |= item.ring_done != before || item.ring_started != started;
    if (!tx_ring_->ask_space()) break;  // the peer's bell resumes
  }
  if (wrote && tx_ring_->reader_idle(SharedRing::now_ns())) bell_due_ = true;
  return completed;
}

bool Connection::poll_ring(int64_t stamp_ns, bool wait) {
  if (!rx_ring_) return false;
  if (stamp_ns != 0) rx_ring_->stamp_polling(stamp_ns);
  std::unique_lock rx(rx_mu_, std::defer_lock);
  if (wait) {
    rx.lock();
  } else if (!rx.try_lock()) {
    return false;  // another caller reads the ring
  }
  if (rx_closed_) return false;
  bool delivered = false;
  bool bell = false;
  std::string why;
  RingRecord rec{};
  while (rx_ring_->next(rec, why) && ring_take(rec, delivered, why)) {
    bell |= rx_ring_->consume(rec);
    if (ring_in_.got == ring_in_.total) delivered |= ring_finish();
  }
  if (!why.empty()) rx_closed_ = true;  // read no more; the io thread closes the connection
  rx.unlock();
  if (!why.empty()) {
    boost::asio::post(owner_.io(), [self = shared_from_this(), why] {
      if (!self->closed()) self->protocol_error(why);
    });
  } else if (bell) {
    std::unique_lock lock(mu_);
    ring_bell(lock);
  }
  if (delivered) owner_.host().wake();
  return delivered;
}

// Takes one record into the message being received (rx_mu_ held). False with
// `why` when the record breaks the format.
bool Connection::ring_take(const RingRecord& rec, bool& delivered, std::string& why) {
  RingIn& in = ring_in_;
  const bool first = (rec.flags & kRingFirst) != 0;
  if (first == in.active || (first && rec.total > kMaxMessage)) {
    why = "message ring: record out of sequence";
    return false;
  }
  if (first) {
    in = RingIn{};
    in.active = true;
    in.total = rec.total;
    bool truncated;
    const PostedRecv r = match_posted(in.total, truncated);
    if (r.req == nullptr) {
      in.msg.data.reset(new char[in.total > 0 ? in.total : 1]);
      in.msg.len = in.total;
      in.dest = in.msg.data.get();
    } else if (truncated) {
      in.discard = true;
      delivered = true;
    } else {
      in.req = r.req;
      in.dest = r.buf;
    }
  }
  if (rec.len > in.total - in.got) {
    why = "message ring: a record runs past the end of its message";
    return false;
  }
  if (!in.discard && rec.len > 0) rx_ring_->copy(0, in.dest + in.got, rec.len);
  in.got += rec.len;
  return true;
}

// The message being received is complete (rx_mu_ held). True when a request completed.
bool Connection::ring_finish() {
  RingIn in = std::move(ring_in_);
  ring_in_ = RingIn{};
  if (in.discard) return false;
  if (in.req != nullptr) {
    in.req->complete(in.total);
    return true;
  }
  return settle(in.msg);
}

// The connection is closing: no more reads; a message half read fails its receive.
void Connection::fail_ring_in(int code, const std::string& why) {
  if (!rx_ring_) return;
  std::lock_guard rx(rx_mu_);
  rx_closed_ = true;
  if (ring_in_.req != nullptr) ring_in_.req->fail(code, why);
  ring_in_ = RingIn{};
}

}  // namespace hmc_net
