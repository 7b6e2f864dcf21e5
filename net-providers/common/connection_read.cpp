// The reader: frames in order, small bytes through the staging buffer, large
// payloads straight into the receive buffer or the registered region.
//
// The socket is non-blocking; the loop reads until the kernel has nothing
// more, then waits for readability. It yields to other connections after a
// bounded number of reads. The completions that one read brings in wake the
// host once.
#include <boost/asio/post.hpp>
#include <cstring>

#include "common/connection.h"
#include "common/stream_provider.h"
#include "hmc/provider/net.h"

namespace hmc_net {

namespace {
constexpr uint64_t kDirectMin = 16 * 1024;
constexpr int kReadsPerTurn = 64;

bool would_block(const boost::system::error_code& ec) {
  return ec == boost::asio::error::would_block || ec == boost::asio::error::try_again;
}
}  // namespace

void Connection::start_reading() {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  if (ec) {
    lost(ec);
    return;
  }
  read_loop();
}

void Connection::resume_reading() {
  if (!held_ || closed()) return;
  held_ = false;
  queue_offer();
  read_loop();
}

void Connection::wait_readable() {
  socket_.async_wait(Socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       if (self->closed()) return;
                       if (ec) {
                         self->lost(ec);
                         return;
                       }
                       self->read_loop();
                     });
}

void Connection::read_loop() {
  try {
    read_turn();
  } catch (const std::bad_alloc&) {
    close(HMC_PROV_ERR_NO_MEMORY, "out of memory while receiving from " + peer_);
  } catch (const std::exception& e) {
    close(HMC_PROV_ERR_INTERNAL, std::string("internal error while receiving: ") + e.what());
  }
  flush_wake();  // what the last step completed
}

void Connection::read_turn(bool to_end) {
  for (int turn = 0; to_end || turn < kReadsPerTurn; ++turn) {
    if (!drain_stage()) return;
    // Everything one read brought in is handled: wake the host once for it
    // now, not after the next read (which usually only says "nothing more").
    flush_wake();
    boost::system::error_code ec;
    const uint64_t left = in_.total - in_.got;
    const bool direct =
        left >= kDirectMin &&
        (in_.sink == Sink::recv || in_.sink == Sink::unexpected || in_.sink == Sink::put);
    if (direct) {
      if (!read_direct(ec)) return;
    } else {
      // drain_stage leaves less than a header behind: moving it is cheap.
      if (stage_begin_ > 0) {
        std::memmove(stage_.get(), stage_.get() + stage_begin_, stage_end_ - stage_begin_);
        stage_end_ -= stage_begin_;
        stage_begin_ = 0;
      }
      size_t n = socket_.read_some(
          boost::asio::buffer(stage_.get() + stage_end_, kStageSize - stage_end_), ec);
      if (!ec) stage_end_ += n;
    }
    if (closed()) return;
    if (would_block(ec)) {
      if (!to_end) wait_readable();
      return;
    }
    if (ec) {
      if (!to_end) lost(ec);
      return;
    }
  }
  boost::asio::post(owner_.io(), [self = shared_from_this()] {
    if (!self->closed()) self->read_loop();
  });
}

// A write failed because the peer reset the connection or went: the messages it sent
// before are still in the socket, ahead of the reset, and close() would discard them
// (its receives would fail as PEER_LOST although every byte arrived).
void Connection::read_rest() {
  if (held_ || closed()) return;
  try {
    read_turn(true);
  } catch (const std::exception&) {
    // close() follows at once with the write's error
  }
  flush_wake();
}

bool Connection::drain_stage() {
  for (;;) {
    if (held_) return false;  // resume_reading goes on from here
    size_t avail = stage_end_ - stage_begin_;
    if (in_.sink == Sink::none) {
      if (avail < sizeof(FrameHeader)) break;
      std::memcpy(&in_.hdr, stage_.get() + stage_begin_, sizeof(FrameHeader));
      stage_begin_ += sizeof(FrameHeader);
      if (!on_header()) return false;
    } else {
      if (avail == 0) break;
      size_t n = static_cast<size_t>(std::min<uint64_t>(avail, in_.total - in_.got));
      const char* p = stage_.get() + stage_begin_;
      stage_begin_ += n;
      if (!take(p, n)) return false;
    }
  }
  if (stage_begin_ == stage_end_) stage_begin_ = stage_end_ = 0;
  return true;
}

bool Connection::on_header() {
  const FrameHeader& h = in_.hdr;
  if (h.magic != kFrameMagic) return protocol_error("bad frame magic");
  auto type = static_cast<FrameType>(h.type);
  if (awaiting_hello_ && type != FrameType::hello)
    return protocol_error("first frame is not a hello");
  switch (type) {
    case FrameType::hello:
      if (!awaiting_hello_) return protocol_error("unexpected hello");
      if (h.length > HMC_NET_HELLO_MAX)
        return protocol_error("hello larger than HMC_NET_HELLO_MAX");
      hello_.resize(h.length);
      begin_payload(Sink::hello, hello_.data(), h.length);
      return !closed();
    case FrameType::msg: {
      if (h.length > kMaxMessage)
        return protocol_error("message of " + std::to_string(h.length) + " bytes");
      bool truncated;
      const PostedRecv r = match_posted(h.length, truncated);
      if (r.req == nullptr) {
        in_.msg.data.reset(new char[h.length > 0 ? h.length : 1]);
        in_.msg.len = h.length;
        begin_payload(Sink::unexpected, in_.msg.data.get(), h.length);
      } else if (truncated) {
        wake_due_ = true;
        begin_payload(Sink::discard, nullptr, h.length);
      } else {
        in_.recv = r.req;
        begin_payload(Sink::recv, r.buf, h.length);
      }
      return !closed();
    }
    case FrameType::put: {
      std::string why;
      char* dest = nullptr;
      bool ok;
      {
        std::lock_guard lock(owner_.regions().mutex());
        ok = owner_.regions().find_locked(h.region, h.key, h.offset, h.length, dest, why);
      }
      if (ok) {
        begin_payload(Sink::put, nullptr, h.length);
      } else {
        in_.sink = Sink::put;  // refuse_put logs and turns it into a drain
        refuse_put(why);
        begin_payload(Sink::refused_put, nullptr, h.length);
      }
      return !closed();
    }
    case FrameType::ack:
    case FrameType::nak: {
      if (await_ack_.empty() || await_ack_.front().seq != h.seq) {
        return protocol_error("ack/nak for a put that is not outstanding");
      }
      if (type == FrameType::ack) {
        if (h.length != 0) return protocol_error("ack with a payload");
        AwaitAck a = await_ack_.front();
        await_ack_.pop_front();
        a.req->complete(a.len);
        wake_due_ = true;
        return true;
      }
      if (h.length > kMaxNakText) return protocol_error("nak text too long");
      in_.why.resize(h.length);
      begin_payload(Sink::nak_text, in_.why.data(), h.length);
      return !closed();
    }
    case FrameType::ring: {
      bool pending;
      {
        std::lock_guard lock(mu_);
        pending = tx_mode_ == TxMode::pending;
      }
      if (!pending || h.length != sizeof(RingOffer))
        return protocol_error("unexpected message ring offer");
      begin_payload(Sink::offer, reinterpret_cast<char*>(&offer_in_), h.length);
      return !closed();
    }
    case FrameType::bell: {
      if (h.length != 0) return protocol_error("bell with a payload");
      poll_ring(0, true);  // the peer wrote while nobody here polled
      std::lock_guard lock(mu_);
      if (tx_mode_ == TxMode::ring && !send_q_.empty()) kick_locked();  // or it made room
      return true;
    }
  }
  return protocol_error("unknown frame type " + std::to_string(h.type));
}

void Connection::begin_payload(Sink sink, char* dest, uint64_t total) {
  in_.sink = sink;
  in_.dest = dest;
  in_.total = total;
  in_.got = 0;
  if (total == 0) finish_payload();
}

void Connection::refuse_put(const std::string& why) {
  if (in_.sink == Sink::put) {
    // The initiator's put fails with the reason; here a line at debug only (a peer putting
    // with stale keys wrote a warning per put: 10,000 lines for 10,000 puts).
    owner_.host().log(HMC_LOG_DEBUG, "refused a put from " + peer_ + ": " + why);
    in_.why = why;
    in_.sink = Sink::refused_put;
  }
}

bool Connection::take(const char* p, size_t n) {
  if (in_.sink == Sink::put) {
    std::string why;
    char* dest = nullptr;
    std::lock_guard lock(owner_.regions().mutex());
    const FrameHeader& h = in_.hdr;
    if (owner_.regions().find_locked(h.region, h.key, h.offset + in_.got, n, dest, why)) {
      std::memcpy(dest, p, n);
    } else {
      refuse_put("region deregistered during the put: " + why);
    }
  } else if (in_.sink != Sink::refused_put && in_.sink != Sink::discard) {
    std::memcpy(in_.dest + in_.got, p, n);
  }
  in_.got += n;
  if (in_.got == in_.total) return finish_payload();
  return true;
}

// Receives the rest of a large payload without the staging copy. Returns false
// when the connection closed underneath.
bool Connection::read_direct(boost::system::error_code& ec) {
  const uint64_t want = in_.total - in_.got;
  size_t n = 0;
  if (in_.sink == Sink::put) {
    // Holding the table lock while receiving keeps dereg_mem from returning
    // while bytes are landing in the region.
    std::lock_guard lock(owner_.regions().mutex());
    const FrameHeader& h = in_.hdr;
    std::string why;
    char* dest = nullptr;
    if (!owner_.regions().find_locked(h.region, h.key, h.offset + in_.got, want, dest, why)) {
      refuse_put("region deregistered during the put: " + why);
      return true;
    }
    n = socket_.read_some(boost::asio::buffer(dest, want), ec);
  } else {
    n = socket_.read_some(boost::asio::buffer(in_.dest + in_.got, want), ec);
  }
  if (ec) return true;
  in_.got += n;
  if (in_.got == in_.total) return finish_payload();
  return true;
}

bool Connection::finish_payload() {
  Sink sink = in_.sink;
  in_.sink = Sink::none;
  switch (sink) {
    case Sink::hello:
      awaiting_hello_ = false;
      if (on_hello_) {
        held_ = true;  // until the host accepts it
        auto cb = std::move(on_hello_);
        on_hello_ = nullptr;
        cb(shared_from_this(), true);
      }
      break;
    case Sink::recv:
      in_.recv->complete(in_.total);
      in_.recv = nullptr;
      wake_due_ = true;
      break;
    case Sink::unexpected:
      wake_due_ |= settle(in_.msg);
      in_.msg = Message{};
      break;
    case Sink::put: {
      FrameHeader ack = make_header(FrameType::ack, 0);
      ack.seq = in_.hdr.seq;
      queue_ctrl(ack);
      break;
    }
    case Sink::refused_put: {
      FrameHeader nak = make_header(FrameType::nak, 0);
      nak.seq = in_.hdr.seq;
      nak.status = HMC_PROV_ERR_OUT_OF_BOUNDS;
      queue_ctrl(nak, in_.why);
      break;
    }
    case Sink::nak_text: {
      AwaitAck a = await_ack_.front();
      await_ack_.pop_front();
      // A refused put is out of bounds (net.h), whatever code the peer's frame carries: a
      // broken peer must not make the host read PEER_LOST or an unknown code here.
      a.req->fail(HMC_PROV_ERR_OUT_OF_BOUNDS, "put refused by the peer: " + in_.why + " (" + peer_ + ")");
      wake_due_ = true;
      break;
    }
    case Sink::offer:
      on_offer();
      break;
    case Sink::discard:
    case Sink::none:
      break;
  }
  return !closed();
}

}  // namespace hmc_net
