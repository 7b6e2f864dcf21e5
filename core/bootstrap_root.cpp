// BootstrapRoot: accepts the ranks of one job, authenticates them, serves allgather as a star
// and reports lost ranks. Threads and locks: all job state lives on the io thread and needs no
// lock. The only lock, mu_, guards the "finished" summary that wait_finished() reads; the io
// thread takes it briefly to publish and never holds it during I/O.
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
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

constexpr auto kHelloTimeout = 10s;   // a connection that has not said hello by then is dropped
// Connections waiting for their hello beyond the job's ranks: past that the oldest is closed
// for each new one, so that a stranger holding connections open can use up neither the
// descriptors of rank 0's process (the root lives there) nor the job's way in: a real rank
// says hello as soon as it connects, before a crowd of idle ones can push it out.
constexpr std::size_t kSpareStrangers = 128;
constexpr auto kSweepPeriod = 1s;
constexpr uint64_t kLoudRefusals = 10;  // refused connections logged one by one per sweep period
constexpr auto kLinger = 250ms;       // how long the destructor lets queued replies drain
constexpr auto kAcceptRetry = 100ms;  // after an accept error such as EMFILE

// Constant time, so that timing does not tell a prober how many leading bytes were right.
bool secrets_equal(const uint8_t* a, const Secret& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < b.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

class BootstrapRoot::Impl {
 public:
  explicit Impl(const Secret& secret)
      : secret_(secret), guard_(io_.get_executor()), acceptor_(io_), sweep_timer_(io_),
        retry_timer_(io_), linger_timer_(io_) {}
  ~Impl() { stop(); }

  Status listen(const std::string& host, uint16_t port);
  void launch();
  uint16_t port() const { return port_; }
  Status wait_finished(Clock::time_point deadline);
  bool over();

 private:
  enum class RankState : uint8_t { kAbsent, kJoined, kFinalized, kLost };
  struct Round {
    std::vector<std::vector<uint8_t>> payloads;  // contrib payloads; each blob starts at byte 8
    std::vector<bool> have;
    int count = 0;
  };

  void run();
  void stop();
  void shut_down();
  void accept();
  void sweep();
  void on_accept(tcp::socket socket);
  void on_frame(Link& link, Type type, std::vector<uint8_t>& payload);
  void on_hello(Link& link, Type type, const std::vector<uint8_t>& payload);
  void on_contrib(Link& link, std::vector<uint8_t>& payload);
  void on_query(Link& link, const std::vector<uint8_t>& payload);
  void on_bye(Link& link);
  void on_close(Link& link, const std::string& why, bool violation);
  void drop(Link& link, const std::string& why);
  void refuse(Link& link, ErrorCode code, const std::string& why);
  void say_refused(const Link& link, const std::string& why);
  uint64_t refused_lately_ = 0;  // refusals since sweep() last looked (io thread)
  std::string last_refused_;  // why and from where the root last refused a hello (io thread)
  void turn_away(Link& link, const std::string& why);
  void lose(int rank, const std::string& why);
  void mark_dead(int rank);
  void complete(uint64_t seq, Round& round);
  wire::Frame fail_frame(uint64_t seq) const;
  wire::Frame lost_frame(int rank) const;
  std::string missing_text(uint64_t seq) const;
  void publish_finished();

  const Secret secret_;
  asio::io_context io_;  // first member: destroyed last, after every socket and timer
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  tcp::acceptor acceptor_;
  asio::steady_timer sweep_timer_;
  asio::steady_timer retry_timer_;
  asio::steady_timer linger_timer_;
  uint16_t port_ = 0;
  std::thread thread_;

  // Io thread only.
  bool stopping_ = false;
  int size_ = 0;  // 0 until the first accepted hello
  std::vector<RankState> state_;
  std::vector<std::shared_ptr<Link>> links_;  // by rank, while connected
  std::vector<uint64_t> next_seq_;            // by rank: calls contributed so far
  std::vector<std::string> lost_reason_;      // by rank
  std::set<std::shared_ptr<Link>> strangers_;  // connected, hello not yet accepted
  uint64_t crowded_out_ = 0;                   // connections closed for kSpareStrangers, not yet logged
  std::map<uint64_t, Round> rounds_;
  // The first call that can never complete because a rank finalized or was lost before it.
  uint64_t dead_floor_ = UINT64_MAX;
  int dead_rank_ = -1;

  // Shared with wait_finished().
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = true;  // no rank is in the job: none joined yet, or all said bye or were lost
  bool joined_ = false;   // some rank joined: a finished job is then over for good
  std::string unfinished_;
};

Status BootstrapRoot::Impl::listen(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  tcp::endpoint endpoint(tcp::v4(), port);
  if (!host.empty()) {
    auto address = asio::ip::make_address(host, ec);
    if (!ec) {
      endpoint = tcp::endpoint(address, port);
    } else {
      tcp::resolver resolver(io_);
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec || results.empty())
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("cannot resolve bootstrap root address {}: {}", host,
                                  ec ? ec.message() : "no addresses"));
      endpoint = results.begin()->endpoint();
    }
  }
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) wire::close_on_exec(acceptor_.native_handle());
  // "::" takes IPv4 peers too (as v4-mapped addresses), whatever the system's default.
  if (!ec && endpoint.address().is_v6() && endpoint.address().is_unspecified())
    acceptor_.set_option(asio::ip::v6_only(false), ec);
  // A restarted job must be able to reuse the port while old connections sit in TIME_WAIT.
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) port_ = acceptor_.local_endpoint(ec).port();
  if (ec)
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cannot listen on {}:{} for the bootstrap root: {}",
                              host.empty() ? "0.0.0.0" : host, port, ec.message()));
  return Status::ok_status();
}

void BootstrapRoot::Impl::launch() {
  accept();
  sweep();
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hmc-boot-root");
    run();
  });
}

void BootstrapRoot::Impl::run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {  // e.g. bad_alloc in a handler: keep serving the job
      HMC_LOG("boot", err, "bootstrap root: io thread caught '{}'; continuing", e.what());
    }
  }
}

void BootstrapRoot::Impl::stop() {
  if (!thread_.joinable()) return;
  asio::post(io_, [this] { shut_down(); });
  thread_.join();
}

// Closes everything; replies already queued (a last gather, a bye ack) get kLinger to drain.
void BootstrapRoot::Impl::shut_down() {
  stopping_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  sweep_timer_.cancel();
  retry_timer_.cancel();
  for (auto& link : strangers_) link->close();
  strangers_.clear();
  bool draining = false;
  for (auto& link : links_) {
    if (!link) continue;
    link->close_after_flush();
    draining = draining || link->flushing();
  }
  guard_.reset();
  if (!draining) return io_.stop();
  linger_timer_.expires_after(kLinger);
  linger_timer_.async_wait([this](boost::system::error_code) { io_.stop(); });
}

void BootstrapRoot::Impl::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (stopping_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      HMC_LOG("boot", warn, "bootstrap root: accept failed: {}; retrying", ec.message());
      retry_timer_.expires_after(kAcceptRetry);
      retry_timer_.async_wait([this](boost::system::error_code e) {
        if (!e && !stopping_) accept();
      });
      return;
    }
    on_accept(std::move(socket));
    accept();
  });
}

// Drops connections that never said hello, so idle strangers cannot pile up.
void BootstrapRoot::Impl::sweep() {
  sweep_timer_.expires_after(kSweepPeriod);
  sweep_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping_) return;
    if (refused_lately_ > kLoudRefusals)
      HMC_LOG("boot", warn, "refused {} more bootstrap connection(s) in the last second", refused_lately_ - kLoudRefusals);
    refused_lately_ = 0;
    if (crowded_out_) {
      HMC_LOG("boot", warn,
              "closed the {} oldest bootstrap connection(s) without a hello: more than {} were waiting for theirs",
              crowded_out_, strangers_.size());
      crowded_out_ = 0;
    }
    const auto now = Clock::now();
    for (auto it = strangers_.begin(); it != strangers_.end();) {
      if (now - (*it)->opened < kHelloTimeout) {
        ++it;
        continue;
      }
      say_refused(**it, fmt::format("no hello within {} s",
                                    std::chrono::duration_cast<std::chrono::seconds>(kHelloTimeout).count()));
      (*it)->close();
      it = strangers_.erase(it);
    }
    sweep();
  });
}

void BootstrapRoot::Impl::on_accept(tcp::socket socket) {
  if (strangers_.size() >= kSpareStrangers + static_cast<std::size_t>(size_)) {
    ++crowded_out_;  // logged by sweep(), once a second at most
    auto oldest = std::min_element(strangers_.begin(), strangers_.end(),
                                   [](const auto& a, const auto& b) { return a->opened < b->opened; });
    (*oldest)->close();
    strangers_.erase(oldest);
  }
  wire::tune_socket(socket);
  auto link = std::make_shared<Link>(std::move(socket));
  strangers_.insert(link);
  link->start([this](Link& l, Type t, std::vector<uint8_t>& p) { on_frame(l, t, p); },
              [this](Link& l, const std::string& why, bool violation) { on_close(l, why, violation); });
}

void BootstrapRoot::Impl::on_frame(Link& link, Type type, std::vector<uint8_t>& payload) {
  if (stopping_) return;
  if (link.rank < 0) return on_hello(link, type, payload);
  switch (type) {
    case Type::kContrib: return on_contrib(link, payload);
    case Type::kQuery: return on_query(link, payload);
    case Type::kBye: return on_bye(link);
    default: return drop(link, fmt::format("sent an unexpected frame of type {}", static_cast<int>(type)));
  }
}

void BootstrapRoot::Impl::on_hello(Link& link, Type type, const std::vector<uint8_t>& payload) {
  auto self = link.shared_from_this();
  strangers_.erase(self);
  wire::Reader in(payload);
  uint32_t magic = 0;
  uint16_t version = 0, reserved = 0;
  const uint8_t* secret = nullptr;
  int32_t rank = -1, size = 0;
  if (type != Type::kHello || !in.u32(magic) || magic != wire::kMagic)
    return turn_away(link, "not an hmc bootstrap hello");
  if (!in.u16(version) || version != wire::kVersion)
    return refuse(link, ErrorCode::kMismatch,
                  fmt::format("bootstrap protocol version {} is not supported (the root speaks {})", version,
                              wire::kVersion));
  if (!in.u16(reserved) || !in.bytes(sizeof(Secret), secret) || !in.i32(rank) || !in.i32(size) || in.left() != 0)
    return turn_away(link, "malformed bootstrap hello");
  if (!secrets_equal(secret, secret_))
    return refuse(link, ErrorCode::kRefused, fmt::format("wrong job secret (its hello names rank {} of {})", rank, size));
  if (size < 1 || size > wire::kMaxRanks)
    return refuse(link, ErrorCode::kRefused,
                  fmt::format("job size {} is out of range (1 to {})", size, wire::kMaxRanks));
  if (size_ == 0) {
    size_ = size;
    state_.assign(size, RankState::kAbsent);
    links_.resize(size);
    next_seq_.assign(size, 0);
    lost_reason_.resize(size);
  } else if (size != size_) {
    return refuse(link, ErrorCode::kMismatch,
                  fmt::format("job size {} differs from the size {} that the first rank to join gave", size, size_));
  }
  if (rank < 0 || rank >= size_)
    return refuse(link, ErrorCode::kRefused, fmt::format("rank {} is out of range for a job of {} ranks", rank, size_));
  switch (state_[rank]) {
    case RankState::kAbsent: break;
    case RankState::kJoined:
      return refuse(link, ErrorCode::kRefused,
                    fmt::format("rank {} already joined the job from {}", rank, links_[rank]->remote()));
    // A rank of this job that left may be the same rank of the next job on this port
    // (from_env again in one process, before this root made room: ContextImpl::start_root).
    // No refusal, which is final: a closed connection, which it retries until the next root
    // is up here or its deadline passes.
    case RankState::kFinalized:
      return turn_away(link, fmt::format("rank {} already left the job (of a next job on this port? it retries)", rank));
    case RankState::kLost:
      return turn_away(link, fmt::format("rank {} was already lost from the job (of a next job on this port? it "
                                         "retries)", rank));
  }
  link.rank = rank;
  link.set_max_payload(wire::kMaxPayload);
  state_[rank] = RankState::kJoined;
  links_[rank] = self;
  publish_finished();  // before the welcome: once connect() returns, wait_finished() waits for it
  link.send(wire::Writer(Type::kWelcome).finish());
  // A late joiner learns of earlier losses at once rather than at its first call's deadline.
  for (int r = 0; r < size_; ++r)
    if (state_[r] == RankState::kLost) link.send(lost_frame(r));
  HMC_LOG("boot", debug, "bootstrap root: rank {} of {} joined from {}", rank, size_, link.remote());
}

void BootstrapRoot::Impl::on_contrib(Link& link, std::vector<uint8_t>& payload) {
  const int rank = link.rank;
  wire::Reader in(payload);
  uint64_t seq = 0;
  if (!in.u64(seq)) return drop(link, "sent a malformed contribution");
  if (in.left() > Bootstrap::kMaxBlobBytes) return drop(link, "sent a blob over the size limit");
  // TCP keeps a rank's calls in order, so anything but the next number is a broken client.
  if (seq != next_seq_[rank])
    return drop(link, fmt::format("sent call #{} where #{} was expected", seq, next_seq_[rank]));
  ++next_seq_[rank];
  if (seq >= dead_floor_) return link.send(fail_frame(seq));
  Round& round = rounds_[seq];
  if (round.have.empty()) {
    round.payloads.resize(size_);
    round.have.assign(size_, false);
  }
  round.payloads[rank] = std::move(payload);
  round.have[rank] = true;
  if (++round.count < size_) return;
  complete(seq, round);
  rounds_.erase(seq);
}

// Sends every rank all blobs of a call, split into frames under the size limit; the frames are
// built once and shared by every link's queue.
void BootstrapRoot::Impl::complete(uint64_t seq, Round& round) {
  constexpr size_t kSeqBytes = 8, kGatherHeader = 16, kLenBytes = 4;
  std::vector<wire::Frame> frames;
  for (int first = 0; first < size_;) {
    size_t bytes = kGatherHeader;
    int count = 0;
    while (first + count < size_) {
      size_t next = kLenBytes + round.payloads[first + count].size() - kSeqBytes;
      if (count > 0 && bytes + next > wire::kMaxPayload) break;
      bytes += next;
      ++count;
    }
    wire::Writer out(Type::kGather, bytes);
    out.u64(seq).u32(first).u32(count);
    for (int r = first; r < first + count; ++r) {
      const auto& p = round.payloads[r];
      out.u32(static_cast<uint32_t>(p.size() - kSeqBytes)).bytes(p.data() + kSeqBytes, p.size() - kSeqBytes);
    }
    frames.push_back(out.finish());
    first += count;
  }
  for (auto& link : links_)
    if (link)
      for (const auto& frame : frames) link->send(frame);
}

void BootstrapRoot::Impl::on_query(Link& link, const std::vector<uint8_t>& payload) {
  wire::Reader in(payload);
  uint64_t seq = 0;
  if (!in.u64(seq)) return drop(link, "sent a malformed query");
  link.send(wire::Writer(Type::kStatus).u64(seq).str(missing_text(seq)).finish());
}

// Which ranks call #seq still waits for, and why: the text a timed-out rank reports.
std::string BootstrapRoot::Impl::missing_text(uint64_t seq) const {
  std::vector<int> absent, behind, lost, finalized;
  for (int r = 0; r < size_; ++r) {
    switch (state_[r]) {
      case RankState::kAbsent: absent.push_back(r); break;
      case RankState::kJoined: if (next_seq_[r] <= seq) behind.push_back(r); break;
      case RankState::kLost: if (next_seq_[r] <= seq) lost.push_back(r); break;
      case RankState::kFinalized: if (next_seq_[r] <= seq) finalized.push_back(r); break;
    }
  }
  std::vector<std::string> parts;
  // A rank refused for a wrong secret or size (another job's settings) counts as absent:
  // the others hear why, not only that it never came.
  if (!absent.empty())
    parts.push_back(wire::format_ranks(absent) + " never joined the job" +
                    (last_refused_.empty() ? "" : " (the root last refused a connection: " + last_refused_ + ")"));
  if (!behind.empty()) parts.push_back(wire::format_ranks(behind) + " joined but did not reach this call");
  if (!lost.empty()) parts.push_back(wire::format_ranks(lost) + " left without finalizing");
  if (!finalized.empty()) parts.push_back(wire::format_ranks(finalized) + " finalized before this call");
  if (parts.empty()) return "every rank reached this call; the result was on its way";
  std::string text = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) text += "; " + parts[i];
  return text;
}

void BootstrapRoot::Impl::on_bye(Link& link) {
  const int rank = link.rank;
  if (state_[rank] != RankState::kJoined) return;
  state_[rank] = RankState::kFinalized;
  link.send(wire::Writer(Type::kByeAck).finish());
  HMC_LOG("boot", debug, "bootstrap root: rank {} finalized after {} calls", rank, next_seq_[rank]);
  mark_dead(rank);
  // Calls the finalized rank never joined can never complete: tell their contributors now.
  for (auto it = rounds_.lower_bound(next_seq_[rank]); it != rounds_.end(); it = rounds_.erase(it)) {
    auto frame = fail_frame(it->first);
    for (int r = 0; r < size_; ++r)
      if (it->second.have[r] && links_[r]) links_[r]->send(frame);
  }
  publish_finished();
}

void BootstrapRoot::Impl::on_close(Link& link, const std::string& why, bool violation) {
  if (stopping_) return;
  if (link.rank < 0) {
    strangers_.erase(link.shared_from_this());
    if (violation)
      say_refused(link, why);
    else
      HMC_LOG("boot", debug, "bootstrap connection from {} closed before its hello: {}", link.remote(), why);
    return;
  }
  const int rank = link.rank;
  if (links_[rank].get() == &link) links_[rank].reset();
  if (state_[rank] == RankState::kJoined) return lose(rank, why);
  HMC_LOG("boot", debug, "bootstrap root: rank {} disconnected after bye", rank);
}

// An accepted rank broke the protocol: cut it off and treat it as lost.
void BootstrapRoot::Impl::drop(Link& link, const std::string& why) {
  HMC_LOG("boot", warn, "bootstrap root: dropping rank {} ({}): it {}", link.rank, link.remote(), why);
  link.close();
  on_close(link, fmt::format("it {}", why), true);
}

// Refusal with a reason the client reports (bad rank, size, secret or version).
// One line per refused connection, up to kLoudRefusals a second; sweep() counts the rest.
void BootstrapRoot::Impl::say_refused(const Link& link, const std::string& why) {
  if (++refused_lately_ <= kLoudRefusals) HMC_LOG("boot", warn, "refused bootstrap connection from {}: {}", link.remote(), why);
}

void BootstrapRoot::Impl::refuse(Link& link, ErrorCode code, const std::string& why) {
  say_refused(link, why);
  last_refused_ = fmt::format("{} from {}", why, link.remote());
  link.send(wire::Writer(Type::kRefuse).u32(static_cast<uint32_t>(code)).str(why).finish());
  link.close_after_flush();
}

// Garbage gets no answer at all.
void BootstrapRoot::Impl::turn_away(Link& link, const std::string& why) {
  say_refused(link, why);
  link.close();
}

void BootstrapRoot::Impl::lose(int rank, const std::string& why) {
  state_[rank] = RankState::kLost;
  lost_reason_[rank] = fmt::format("rank {} left the job without finalizing ({})", rank, why);
  HMC_LOG("boot", warn, "bootstrap root: {}", lost_reason_[rank]);
  auto frame = lost_frame(rank);
  for (auto& link : links_)
    if (link) link->send(frame);
  mark_dead(rank);
  // Calls the lost rank had not joined can never complete; their contributors fail on the
  // lost notice, so the root only frees them.
  rounds_.erase(rounds_.lower_bound(next_seq_[rank]), rounds_.end());
  publish_finished();
}

void BootstrapRoot::Impl::mark_dead(int rank) {
  if (next_seq_[rank] >= dead_floor_) return;
  dead_floor_ = next_seq_[rank];
  dead_rank_ = rank;
}

wire::Frame BootstrapRoot::Impl::fail_frame(uint64_t seq) const {
  const int r = dead_rank_;
  const bool lost = state_[r] == RankState::kLost;
  const ErrorCode code = lost ? ErrorCode::kPeerLost : ErrorCode::kMismatch;
  const std::string why =
      lost ? lost_reason_[r]
           : fmt::format("rank {} finalized after {} bootstrap calls, so call #{} can never complete", r,
                         next_seq_[r], seq);
  return wire::Writer(Type::kFail).u64(seq).u32(static_cast<uint32_t>(code)).str(why).finish();
}

wire::Frame BootstrapRoot::Impl::lost_frame(int rank) const {
  return wire::Writer(Type::kLost).i32(rank).str(lost_reason_[rank]).finish();
}

// Ranks that never joined do not hold the job open: once any call completed every rank had
// joined, and if none did the job has failed and nobody is left to serve.
void BootstrapRoot::Impl::publish_finished() {
  std::vector<int> active;
  bool joined = false;
  for (int r = 0; r < size_; ++r) {
    if (state_[r] == RankState::kJoined) active.push_back(r);
    joined |= state_[r] != RankState::kAbsent;
  }
  {
    std::lock_guard lock(mu_);
    finished_ = active.empty();
    joined_ = joined;
    unfinished_ = active.empty() ? std::string() : wire::format_ranks(active) + " did not say bye";
  }
  cv_.notify_all();
}

bool BootstrapRoot::Impl::over() {
  std::lock_guard lock(mu_);
  return joined_ && finished_;
}

Status BootstrapRoot::Impl::wait_finished(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (cv_.wait_until(lock, deadline, [this] { return finished_; })) return Status::ok_status();
  return Status(ErrorCode::kTimeout, fmt::format("bootstrap job not finished by the deadline: {}", unfinished_));
}

BootstrapRoot::BootstrapRoot(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BootstrapRoot::~BootstrapRoot() = default;

Result<std::unique_ptr<BootstrapRoot>> BootstrapRoot::start(const std::string& bind_host, uint16_t port,
                                                            const Secret& secret) {
  try {
    auto impl = std::make_unique<Impl>(secret);
    HMC_RETURN_IF_ERROR(impl->listen(bind_host, port));
    impl->launch();
    return std::unique_ptr<BootstrapRoot>(new BootstrapRoot(std::move(impl)));
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, fmt::format("cannot start the bootstrap root: {}", e.what()));
  }
}

uint16_t BootstrapRoot::port() const { return impl_->port(); }

Status BootstrapRoot::wait_finished(Clock::time_point deadline) { return impl_->wait_finished(deadline); }
bool BootstrapRoot::over() const { return impl_->over(); }

}  // namespace hmc::core
