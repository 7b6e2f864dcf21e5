// Bootstrap wire format and the framed TCP link that the root and the ranks share.
//
// Frame: u32 payload length | u8 type | payload; integers little-endian. The length never
// exceeds kMaxPayload, and the first frame of a connection (the hello) may not exceed
// kMaxHelloPayload, so a stranger cannot make the root allocate more than that.
//
//   hello    rank->root  u32 magic "HMCB" | u16 version | u16 zero | u8[16] secret | i32 rank | i32 size
//   welcome  root->rank  (empty)
//   refuse   root->rank  u32 error code | str reason                 (the root then closes)
//   contrib  rank->root  u64 seq | blob (the rest of the payload)
//   gather   root->rank  u64 seq | u32 first rank | u32 count | count x (u32 length | bytes)
//   query    rank->root  u64 seq                (sent shortly before a wait's deadline)
//   status   root->rank  u64 seq | str which ranks the call still waits for
//   fail     root->rank  u64 seq | u32 error code | str reason (the call can never complete)
//   lost     root->rank  i32 rank | str reason
//   bye      rank->root  (empty)
//   bye_ack  root->rank  (empty)
//   str = u32 length | bytes
//
// A gather result is split over as many gather frames as needed to keep each under the limit.
#pragma once

#include <fcntl.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <vector>

#include <boost/asio.hpp>
#ifdef __linux__
#include <netinet/tcp.h>
#endif

#include "core/bootstrap.h"
#include "core/log.h"

namespace hmc::core::wire {

namespace asio = boost::asio;
using asio::ip::tcp;

inline constexpr uint32_t kMagic = 0x42434d48;  // bytes "HMCB"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 5;
inline constexpr uint32_t kHelloBytes = 32;
// What a stranger may send before it is accepted: room for a longer hello of a later version,
// so that it gets a version message rather than a bare close.
inline constexpr uint32_t kMaxHelloPayload = 256;
inline constexpr uint32_t kMaxPayload = 64u << 20;
inline constexpr int kMaxRanks = 1 << 20;
static_assert(Bootstrap::kMaxBlobBytes + 20 <= kMaxPayload, "one blob must fit a gather frame");

enum class Type : uint8_t {
  kHello = 1, kWelcome, kRefuse, kContrib, kGather, kQuery, kStatus, kFail, kLost, kBye, kByeAck,
};

using Frame = std::shared_ptr<const std::vector<uint8_t>>;  // shared by every link it goes to

// Builds one frame; finish() patches the length into the header.
class Writer {
 public:
  explicit Writer(Type type, size_t payload_hint = 0) {
    buf_.reserve(kHeaderBytes + payload_hint);
    buf_.resize(kHeaderBytes);
    buf_[4] = static_cast<uint8_t>(type);
  }
  Writer& u16(uint16_t v) { return put(v, 2); }
  Writer& u32(uint32_t v) { return put(v, 4); }
  Writer& u64(uint64_t v) { return put(v, 8); }
  Writer& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  Writer& bytes(const uint8_t* p, size_t n) {
    buf_.insert(buf_.end(), p, p + n);
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  Frame finish() {
    put_at(0, static_cast<uint32_t>(buf_.size() - kHeaderBytes));
    return std::make_shared<const std::vector<uint8_t>>(std::move(buf_));
  }

 private:
  Writer& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  void put_at(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  std::vector<uint8_t> buf_;
};

// Bounds-checked parsing: every getter returns false, and leaves the reader failed, on overrun.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& payload) : p_(payload.data()), left_(payload.size()) {}
  bool u16(uint16_t& v) { return get(v, 2); }
  bool u32(uint32_t& v) { return get(v, 4); }
  bool u64(uint64_t& v) { return get(v, 8); }
  bool i32(int32_t& v) {
    uint32_t u = 0;
    if (!u32(u)) return false;
    v = static_cast<int32_t>(u);
    return true;
  }
  bool bytes(size_t n, const uint8_t*& out) {
    if (n > left_) return fail();
    out = p_;
    p_ += n;
    left_ -= n;
    return true;
  }
  bool str(std::string& s) {
    uint32_t n = 0;
    const uint8_t* p = nullptr;
    if (!u32(n) || !bytes(n, p)) return false;
    s.assign(reinterpret_cast<const char*>(p), n);
    return true;
  }
  size_t left() const { return left_; }

 private:
  template <class T>
  bool get(T& v, int n) {
    if (left_ < static_cast<size_t>(n)) return fail();
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= static_cast<uint64_t>(p_[i]) << (8 * i);
    v = static_cast<T>(x);
    p_ += n;
    left_ -= n;
    return true;
  }
  bool fail() {
    left_ = 0;
    return false;
  }
  const uint8_t* p_;
  size_t left_;
};

// Error codes travel as u32; anything unknown becomes kInternal rather than an invalid enum.
inline ErrorCode to_error_code(uint32_t v) {
  return v >= 1 && v <= static_cast<uint32_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(v)
                                                                      : ErrorCode::kInternal;
}

// "rank 3", "ranks 0-2, 5": compact enough for jobs of thousands of ranks.
inline std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  constexpr size_t kMaxRuns = 16;
  size_t runs = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs == kMaxRuns) {
      out += fmt::format(", ... ({} in all)", ranks.size());
      break;
    }
    if (runs++ > 0) out += ", ";
    out += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

// Keepalive probes, so that a host that vanishes without closing (power loss, cable) is noticed
// in about 30 s instead of the kernel's two hours.
// Descriptors of HMC's own are closed in programs the process executes: a child that kept
// a rank's connection open would hide the rank's death from its peers. asio opens sockets
// without SOCK_CLOEXEC, so the flag is set once open.
inline void close_on_exec(int fd) {
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

inline void tune_socket(tcp::socket& s) {
  close_on_exec(s.native_handle());
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  s.set_option(asio::socket_base::keep_alive(true), ec);
#ifdef __linux__
  int idle = 15, interval = 5, count = 3;
  ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
}

inline std::string endpoint_text(const tcp::socket& s, bool remote) {
  boost::system::error_code ec;
  tcp::endpoint ep = remote ? s.remote_endpoint(ec) : s.local_endpoint(ec);
  if (ec) return "unknown address";
  return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

// One framed connection, used only on its io thread. Reads frames in a loop and hands each to
// on_frame; sends frames in order from a queue. on_close runs once when the peer closes or an
// error ends the link (violation = the peer broke the framing, e.g. an oversized frame); a local
// close() runs no callback. Pending handlers keep the link alive through shared_from_this, so
// an owner may drop it at any time.
class Link : public std::enable_shared_from_this<Link> {
 public:
  using OnFrame = std::function<void(Link&, Type, std::vector<uint8_t>&)>;
  using OnClose = std::function<void(Link&, const std::string& why, bool violation)>;

  explicit Link(tcp::socket socket) : socket_(std::move(socket)), remote_(endpoint_text(socket_, true)) {}

  void set_max_payload(uint32_t n) { max_payload_ = n; }
  void start(OnFrame on_frame, OnClose on_close) {
    on_frame_ = std::move(on_frame);
    on_close_ = std::move(on_close);
    read_header();
  }
  void send(Frame frame) {
    if (closed_ || closing_) return;
    queue_.push_back(std::move(frame));
    if (!writing_) write_next();
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    queue_.clear();
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }
  // Sends what is queued, then closes (a refusal reaches the client before the FIN).
  void close_after_flush() {
    if (!writing_) return close();
    closing_ = true;
  }
  bool closed() const { return closed_; }
  bool flushing() const { return writing_ && !closed_; }
  const std::string& remote() const { return remote_; }

  int rank = -1;  // the root's bookkeeping: the rank this link belongs to once accepted
  std::chrono::steady_clock::time_point opened = std::chrono::steady_clock::now();

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_),
                     [this, self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (closed_) return;
                       if (ec) return fail(describe(ec));
                       uint32_t n = 0;
                       for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(header_[i]) << (8 * i);
                       if (n > max_payload_)
                         return fail(fmt::format("frame of {} bytes exceeds the limit of {}", n, max_payload_), true);
                       read_payload(static_cast<Type>(header_[4]), n);
                     });
  }
  void read_payload(Type type, uint32_t n) {
    payload_.resize(n);
    asio::async_read(socket_, asio::buffer(payload_),
                     [this, type, self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (closed_) return;
                       if (ec) return fail(describe(ec));
                       on_frame_(*this, type, payload_);
                       if (!closed_) read_header();
                     });
  }
  void write_next() {
    writing_ = true;
    asio::async_write(socket_, asio::buffer(*queue_.front()),
                      [this, self = shared_from_this()](boost::system::error_code ec, size_t) {
                        writing_ = false;
                        if (closed_) return;
                        if (ec) return fail(describe(ec));
                        queue_.pop_front();
                        if (!queue_.empty()) return write_next();
                        if (closing_) close();
                      });
  }
  void fail(const std::string& why, bool violation = false) {
    close();
    if (on_close_) on_close_(*this, why, violation);
  }
  static std::string describe(const boost::system::error_code& ec) {
    return ec == asio::error::eof ? std::string("connection closed") : ec.message();
  }

  tcp::socket socket_;
  std::string remote_;
  uint32_t max_payload_ = kMaxHelloPayload;
  std::array<uint8_t, kHeaderBytes> header_{};
  std::vector<uint8_t> payload_;
  std::deque<Frame> queue_;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  OnFrame on_frame_;
  OnClose on_close_;
};

}  // namespace hmc::core::wire
