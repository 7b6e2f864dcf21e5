// Bootstrap (rank side): connects to the root with retries, authenticates, and turns root
// messages into results for callers blocked in allgather/barrier/finalize.
//
// Threads and locks: one io thread owns the socket and everything asio. Callers never touch
// the socket; they post frames to the io thread and wait on cv_ with their deadline. mu_ is the
// only lock and guards the state shared with callers (phase, rounds, lost set, flags). The io
// thread holds it only to publish what a frame said, never during I/O, and never while calling
// on_change_, so a callback may call back into this object.
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/bootstrap.h"
#include "core/bootstrap_wire.h"
#include "core/log.h"

namespace hmc::core {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Link;
using wire::Type;

constexpr Clock::duration kFirstBackoff = 10ms;
constexpr Clock::duration kMaxBackoff = 500ms;
// Shortly before a wait's deadline the rank asks the root which ranks are missing, so that a
// timeout can name them; the question goes out this long (at most) before the deadline.
constexpr Clock::duration kQueryLead = 200ms;
// The root's answer to bye is a round trip: finalize waits at least this long for it, even
// when the caller's deadline (one for the whole finalize, whose barrier may have waited for
// a late peer until just before it) has passed. Before, such a finalize failed "after 0 ms".
constexpr Clock::duration kByeGrace = 2s;

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

Result<long> parse_number(const std::string& text, long lo, long hi, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  // strtol also takes leading blanks and a '+': the text must be digits (a '-' for negatives).
  const bool digits = !text.empty() && text.find_first_not_of("-0123456789") == std::string::npos;
  if (!digits || *end || errno == ERANGE || v < lo || v > hi)
    return Status(ErrorCode::kInvalidArgument,
                  what + " '" + text + "' is not a number from " + std::to_string(lo) + " to " + std::to_string(hi));
  return v;
}

Result<RootAddress> parse_root(const std::string& root) {
  const auto colon = root.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Status(ErrorCode::kInvalidArgument, "bootstrap root '" + root + "' is not host:port");
  auto port = parse_number(root.substr(colon + 1), 1, 65535, "the port of bootstrap root '" + root + "',");
  if (!port) return port.status();
  std::string host = root.substr(0, colon);
  // "[fd00::1]": the resolver takes the address without its brackets.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return RootAddress{host, static_cast<uint16_t>(port.value())};
}

std::string root_bind_host(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  if (host.rfind("127.", 0) == 0) return host;
  if (host == "::1" || host == "[::1]") return "::1";
  // An IPv6 address: every interface of both families (dual stack), where IPv4's alone
  // would refuse every rank.
  if (host.find(':') != std::string::npos) return "::";
  return "";
}

bool is_local_address(const std::string& host) {
  std::string name = host.size() > 2 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return true;
  bool local = false;
  for (addrinfo* a = found; a != nullptr && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any free one
    ::close(fd);
  }
  freeaddrinfo(found);
  return local;
}

class Bootstrap::Impl {
 public:
  Impl(std::string host, uint16_t port, const Secret& secret, int rank, int size)
      : host_(std::move(host)), port_(port), secret_(secret), rank_(rank), size_(size),
        guard_(io_.get_executor()), resolver_(io_), retry_timer_(io_) {}
  ~Impl();

  Status connect(Clock::time_point deadline);
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string local_ip() const;
  Result<std::vector<std::vector<uint8_t>>> exchange(const std::vector<uint8_t>& mine, Clock::time_point deadline,
                                                     const char* what);
  bool is_lost(int rank) const;
  std::vector<int> lost_peers() const;
  void set_on_change(std::function<void()> fn);
  Status finalize(Clock::time_point deadline);
  void abort();

 private:
  enum class Phase { kConnecting, kReady, kRefused };
  struct Round {
    std::vector<std::vector<uint8_t>> blobs;
    int received = 0;
    std::optional<Status> failed;  // the root said this call can never complete
    std::string missing;           // the root's answer to our query: who the call waits for
  };

  void run();
  void attempt();
  void retry(std::string why);
  void on_frame(Link& link, Type type, std::vector<uint8_t>& payload);
  void on_gather(Link& link, wire::Reader& in);
  // `from`: the link that closed (nullptr: a protocol error, final). Before the welcome a
  // close is retried, as a failed connect is.
  void on_close(const std::string& why, const Link* from = nullptr);
  void protocol_error(Link& link, const std::string& what);
  void post_send(wire::Frame frame);
  void post_close();
  void notify_change();
  std::string root_text() const { return fmt::format("{}:{}", host_, port_); }
  Status broken_locked() const;  // why no call can succeed now; ok if one can
  Status root_lost_status_locked() const;

  const std::string host_;
  const uint16_t port_;
  const Secret secret_;
  const int rank_;
  const int size_;

  // Io thread only.
  asio::io_context io_;  // first of these: destroyed after every socket and timer
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  tcp::resolver resolver_;
  asio::steady_timer retry_timer_;
  std::shared_ptr<Link> link_;
  Clock::time_point connect_deadline_;
  Clock::duration backoff_ = kFirstBackoff;
  std::thread thread_;

  // Shared with callers, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kConnecting;
  Status refusal_;
  std::string last_error_ = "no attempt finished yet";
  int attempts_ = 0;
  std::string local_ip_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Round> rounds_;  // calls in flight, by sequence number
  std::map<int, std::string> lost_;   // rank -> why, as the root reported it
  bool root_lost_ = false;
  std::string root_lost_why_;
  bool aborted_ = false;
  bool finalized_ = false;
  bool bye_acked_ = false;
  std::function<void()> on_change_;
};

Bootstrap::Impl::~Impl() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
  if (link_) link_->close();  // without a bye: the root reports this rank lost
}

void Bootstrap::Impl::run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      HMC_LOG("boot", err, "bootstrap rank {}: io thread caught '{}'; continuing", rank_, e.what());
    }
  }
}

Status Bootstrap::Impl::connect(Clock::time_point deadline) {
  const auto start = Clock::now();
  connect_deadline_ = deadline;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hmc-boot");
    run();
  });
  asio::post(io_, [this] { attempt(); });
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [this] { return phase_ != Phase::kConnecting; }))
    return Status(ErrorCode::kTimeout,
                  fmt::format("rank {} could not join the bootstrap root at {} within {} ms: {} ({} attempts)", rank_,
                              root_text(), ms_since(start), last_error_, attempts_));
  return phase_ == Phase::kReady ? Status::ok_status() : refusal_;
}

// One connection attempt: resolve, connect, say hello. Failures before the hello is answered
// are retried (the root may not be up yet); an answer, even a refusal, is final.
void Bootstrap::Impl::attempt() {
  {
    std::lock_guard lock(mu_);
    ++attempts_;
  }
  resolver_.async_resolve(host_, std::to_string(port_), [this](boost::system::error_code ec,
                                                               tcp::resolver::results_type results) {
    if (ec) return retry(fmt::format("cannot resolve {}: {}", host_, ec.message()));
    auto socket = std::make_shared<tcp::socket>(io_);
    asio::async_connect(*socket, results, [this, socket](boost::system::error_code ec, const tcp::endpoint&) {
      if (ec) return retry(ec.message());
      wire::tune_socket(*socket);
      auto local = socket->local_endpoint(ec);
      link_ = std::make_shared<Link>(std::move(*socket));
      link_->set_max_payload(wire::kMaxPayload);
      link_->start([this](Link& l, Type t, std::vector<uint8_t>& p) { on_frame(l, t, p); },
                   [this](Link& l, const std::string& why, bool) { on_close(why, &l); });
      {
        std::lock_guard lock(mu_);
        local_ip_ = ec ? std::string() : local.address().to_string();
        last_error_ = "connected, but the root did not answer the hello";
      }
      link_->send(wire::Writer(Type::kHello, wire::kHelloBytes)
                      .u32(wire::kMagic)
                      .u16(wire::kVersion)
                      .u16(0)
                      .bytes(secret_.data(), secret_.size())
                      .i32(rank_)
                      .i32(size_)
                      .finish());
    });
  });
}

void Bootstrap::Impl::retry(std::string why) {
  {
    std::lock_guard lock(mu_);
    last_error_ = std::move(why);
  }
  const auto left = connect_deadline_ - Clock::now();
  if (left <= Clock::duration::zero()) return;  // the caller's wait ends with last_error_
  retry_timer_.expires_after(std::min(backoff_, left));
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  retry_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) attempt();
  });
}

void Bootstrap::Impl::on_frame(Link& link, Type type, std::vector<uint8_t>& payload) {
  wire::Reader in(payload);
  Phase phase;
  {
    std::lock_guard lock(mu_);
    phase = phase_;
  }
  if (phase == Phase::kConnecting && type != Type::kWelcome && type != Type::kRefuse)
    return protocol_error(link, fmt::format("frame type {} before its welcome", static_cast<int>(type)));
  switch (type) {
    case Type::kWelcome: {
      std::lock_guard lock(mu_);
      if (phase_ == Phase::kConnecting) phase_ = Phase::kReady;
      break;
    }
    case Type::kRefuse: {
      if (phase != Phase::kConnecting) return protocol_error(link, "a refusal after its welcome");
      uint32_t code = 0;
      std::string why;
      if (!in.u32(code) || !in.str(why)) why = "no reason given";
      link.close();
      std::lock_guard lock(mu_);
      phase_ = Phase::kRefused;
      refusal_ = Status(wire::to_error_code(code),
                        fmt::format("bootstrap root {} refused rank {}: {}", root_text(), rank_, why));
      break;
    }
    case Type::kGather: return on_gather(link, in);
    case Type::kStatus: {
      uint64_t seq = 0;
      std::string text;
      if (!in.u64(seq) || !in.str(text)) return protocol_error(link, "a malformed status");
      std::lock_guard lock(mu_);
      if (auto it = rounds_.find(seq); it != rounds_.end()) it->second.missing = std::move(text);
      return;  // nobody needs waking: the text only matters once the deadline passes
    }
    case Type::kFail: {
      uint64_t seq = 0;
      uint32_t code = 0;
      std::string why;
      if (!in.u64(seq) || !in.u32(code) || !in.str(why)) return protocol_error(link, "a malformed failure");
      std::lock_guard lock(mu_);
      if (auto it = rounds_.find(seq); it != rounds_.end()) it->second.failed = Status(wire::to_error_code(code), why);
      break;
    }
    case Type::kLost: {
      int32_t rank = -1;
      std::string why;
      if (!in.i32(rank) || !in.str(why) || rank < 0 || rank >= size_) return protocol_error(link, "a malformed loss");
      {
        std::lock_guard lock(mu_);
        if (rank == rank_ || !lost_.emplace(rank, std::move(why)).second) return;
      }
      notify_change();  // first, so that a caller failing on this loss usually finds it reported
      break;
    }
    case Type::kByeAck: {
      std::lock_guard lock(mu_);
      bye_acked_ = true;
      break;
    }
    default: return protocol_error(link, fmt::format("unexpected frame type {}", static_cast<int>(type)));
  }
  cv_.notify_all();
}

// Copies the blobs out of the frame before taking the lock; a result for a call that already
// timed out or failed is dropped.
void Bootstrap::Impl::on_gather(Link& link, wire::Reader& in) {
  uint64_t seq = 0;
  uint32_t first = 0, count = 0;
  if (!in.u64(seq) || !in.u32(first) || !in.u32(count) || first > static_cast<uint32_t>(size_) ||
      count > static_cast<uint32_t>(size_) - first)
    return protocol_error(link, "a malformed gather");
  std::vector<std::vector<uint8_t>> blobs(count);
  for (auto& blob : blobs) {
    uint32_t n = 0;
    const uint8_t* p = nullptr;
    if (!in.u32(n) || !in.bytes(n, p)) return protocol_error(link, "a truncated gather");
    blob.assign(p, p + n);
  }
  {
    std::lock_guard lock(mu_);
    auto it = rounds_.find(seq);
    if (it == rounds_.end()) return;
    Round& round = it->second;
    for (uint32_t i = 0; i < count; ++i) round.blobs[first + i] = std::move(blobs[i]);
    round.received += static_cast<int>(count);
    if (round.received < size_) return;
  }
  cv_.notify_all();
}

void Bootstrap::Impl::protocol_error(Link& link, const std::string& what) {
  HMC_LOG("boot", err, "bootstrap rank {}: the root sent {}; closing the control connection", rank_, what);
  link.close();
  on_close(fmt::format("the root sent {}", what));
}

void Bootstrap::Impl::on_close(const std::string& why, const Link* from) {
  bool changed = false;
  {
    std::unique_lock lock(mu_);
    if (phase_ == Phase::kConnecting && from != nullptr) {
      // A root crowded by strangers closes its oldest connections; a root that is not
      // HMC's closes at once and the wait ends at the deadline with this reason.
      if (from != link_.get()) return;  // an earlier attempt's
      lock.unlock();
      return retry(fmt::format("the root closed the connection before answering the hello ({}); is it the root "
                               "of this job?",
                               why));
    }
    if (phase_ == Phase::kConnecting) {
      phase_ = Phase::kRefused;
      refusal_ = Status(ErrorCode::kRefused,
                        fmt::format("bootstrap root {} closed the connection during the handshake of rank {} ({}); "
                                    "is it the root of this job?",
                                    root_text(), rank_, why));
    } else if (!aborted_ && !finalized_ && !bye_acked_ && !root_lost_) {
      root_lost_ = true;
      root_lost_why_ = why;
      changed = true;
    }
  }
  if (changed) {
    HMC_LOG("boot", warn, "bootstrap rank {}: control connection to {} lost ({}); every peer counts as lost", rank_,
            root_text(), why);
    notify_change();
  }
  cv_.notify_all();
}

void Bootstrap::Impl::notify_change() {
  std::function<void()> fn;
  {
    std::lock_guard lock(mu_);
    fn = on_change_;
  }
  if (!fn) return;
  try {
    fn();
  } catch (const std::exception& e) {
    HMC_LOG("boot", err, "bootstrap rank {}: on_change callback threw '{}'", rank_, e.what());
  }
}

void Bootstrap::Impl::post_send(wire::Frame frame) {
  asio::post(io_, [this, frame = std::move(frame)]() mutable {
    if (link_) link_->send(std::move(frame));
  });
}

void Bootstrap::Impl::post_close() {
  asio::post(io_, [this] {
    if (link_) link_->close();
  });
}

Status Bootstrap::Impl::root_lost_status_locked() const {
  return Status(ErrorCode::kPeerLost,
                root_lost_why_ == "connection closed"
                    ? std::string("control plane lost: root connection closed")
                    : fmt::format("control plane lost: root connection closed ({})", root_lost_why_));
}

Status Bootstrap::Impl::broken_locked() const {
  if (aborted_) return Status(ErrorCode::kAborted, fmt::format("bootstrap of rank {} was aborted", rank_));
  if (finalized_) return Status(ErrorCode::kFinalized, fmt::format("bootstrap of rank {} was finalized", rank_));
  if (root_lost_) return root_lost_status_locked();
  if (!lost_.empty()) return Status(ErrorCode::kPeerLost, lost_.begin()->second);
  return Status::ok_status();
}

Result<std::vector<std::vector<uint8_t>>> Bootstrap::Impl::exchange(const std::vector<uint8_t>& mine,
                                                                    Clock::time_point deadline, const char* what) {
  if (mine.size() > kMaxBlobBytes)
    return Status(ErrorCode::kInvalidArgument, fmt::format("bootstrap {} blob of {} bytes exceeds the limit of {}",
                                                           what, mine.size(), kMaxBlobBytes));
  const auto start = Clock::now();
  std::unique_lock lock(mu_);
  HMC_RETURN_IF_ERROR(broken_locked());
  const uint64_t seq = next_seq_++;
  Round& round = rounds_[seq];  // map nodes are stable; only this call erases it
  round.blobs.resize(size_);
  lock.unlock();
  post_send(wire::Writer(Type::kContrib, 8 + mine.size()).u64(seq).bytes(mine.data(), mine.size()).finish());
  lock.lock();

  auto settled = [&] { return round.received >= size_ || round.failed || !broken_locked().ok(); };
  const auto query_at = deadline - std::clamp((deadline - start) / 5, Clock::duration::zero(), kQueryLead);
  if (!cv_.wait_until(lock, query_at, settled)) {
    post_send(wire::Writer(Type::kQuery, 8).u64(seq).finish());
    cv_.wait_until(lock, deadline, settled);
  }
  Round done = std::move(round);
  rounds_.erase(seq);
  if (done.received >= size_) return std::move(done.blobs);
  if (done.failed) return *done.failed;
  HMC_RETURN_IF_ERROR(broken_locked());
  return Status(ErrorCode::kTimeout,
                fmt::format("bootstrap {} #{} of rank {} timed out after {} ms: {}", what, seq, rank_, ms_since(start),
                            done.missing.empty() ? "the root did not say which ranks are missing" : done.missing));
}

Status Bootstrap::Impl::finalize(Clock::time_point deadline) {
  const auto start = Clock::now();
  std::unique_lock lock(mu_);
  if (finalized_) return Status::ok_status();
  if (aborted_) return broken_locked();
  if (root_lost_) {
    finalized_ = true;
    return root_lost_status_locked();
  }
  lock.unlock();
  post_send(wire::Writer(Type::kBye).finish());
  lock.lock();
  cv_.wait_until(lock, std::max(deadline, start + kByeGrace), [this] { return bye_acked_ || root_lost_ || aborted_; });
  Status result = Status::ok_status();
  if (aborted_)
    result = broken_locked();
  else if (!bye_acked_ && root_lost_)
    result = root_lost_status_locked();
  else if (!bye_acked_)
    result = Status(ErrorCode::kTimeout,
                    fmt::format("finalize of rank {} timed out after {} ms waiting for the root to acknowledge bye",
                                rank_, ms_since(start)));
  finalized_ = true;
  lock.unlock();
  cv_.notify_all();  // calls racing with finalize from other threads end with kFinalized
  post_close();
  return result;
}

void Bootstrap::Impl::abort() {
  {
    std::lock_guard lock(mu_);
    if (aborted_) return;
    aborted_ = true;
  }
  cv_.notify_all();
  post_close();
}

std::string Bootstrap::Impl::local_ip() const {
  std::lock_guard lock(mu_);
  return local_ip_;
}

bool Bootstrap::Impl::is_lost(int rank) const {
  if (rank < 0 || rank >= size_ || rank == rank_) return false;
  std::lock_guard lock(mu_);
  return root_lost_ || lost_.count(rank) > 0;
}

std::vector<int> Bootstrap::Impl::lost_peers() const {
  std::vector<int> out;
  std::lock_guard lock(mu_);
  if (root_lost_) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) out.push_back(r);
    return out;
  }
  for (const auto& [rank, why] : lost_) out.push_back(rank);
  return out;
}

void Bootstrap::Impl::set_on_change(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  on_change_ = std::move(fn);
}

// Public surface: argument checks and the no-exceptions boundary.

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bootstrap::~Bootstrap() = default;

Result<std::unique_ptr<Bootstrap>> Bootstrap::connect(const std::string& root_host, uint16_t root_port,
                                                      const Secret& secret, int rank, int size,
                                                      Clock::time_point deadline) {
  if (size < 1 || size > wire::kMaxRanks)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("job size {} is out of range (1 to {})", size, wire::kMaxRanks));
  if (rank < 0 || rank >= size)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("rank {} is out of range for a job of {} ranks", rank, size));
  if (root_host.empty()) return Status(ErrorCode::kInvalidArgument, "bootstrap root host is empty");
  try {
    auto impl = std::make_unique<Impl>(root_host, root_port, secret, rank, size);
    HMC_RETURN_IF_ERROR(impl->connect(deadline));
    return std::unique_ptr<Bootstrap>(new Bootstrap(std::move(impl)));
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, fmt::format("rank {} cannot start its bootstrap: {}", rank, e.what()));
  }
}

int Bootstrap::rank() const { return impl_->rank(); }
int Bootstrap::size() const { return impl_->size(); }
std::string Bootstrap::local_ip() const { return impl_->local_ip(); }

Result<std::vector<std::vector<uint8_t>>> Bootstrap::allgather(const std::vector<uint8_t>& mine,
                                                               Clock::time_point deadline) {
  try {
    return impl_->exchange(mine, deadline, "allgather");
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kNoMemory, "out of memory in bootstrap allgather");
  }
}

Status Bootstrap::barrier(Clock::time_point deadline) {
  try {
    auto result = impl_->exchange({}, deadline, "barrier");
    return result.ok() ? Status::ok_status() : result.status();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kNoMemory, "out of memory in bootstrap barrier");
  }
}

bool Bootstrap::is_lost(int rank) const { return impl_->is_lost(rank); }
std::vector<int> Bootstrap::lost_peers() const { return impl_->lost_peers(); }
void Bootstrap::set_on_change(std::function<void()> fn) { impl_->set_on_change(std::move(fn)); }

Status Bootstrap::finalize(Clock::time_point deadline) {
  try {
    return impl_->finalize(deadline);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kNoMemory, "out of memory in bootstrap finalize");
  }
}

void Bootstrap::abort() { impl_->abort(); }

}  // namespace hmc::core
