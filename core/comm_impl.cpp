// CommImpl set-up and lifecycle: bootstrap, cards, path negotiation, connections.
#include "core/comm_impl.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/path_negotiation.h"

namespace hmc::core {
namespace {

constexpr std::size_t kCtrlSlots = 4;

bool same_secret(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;  // constant time: a stranger learns nothing from timing
  for (int i = 0; i < 16; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

uint64_t derive_comm_id(const UniqueId& id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the whole id
  for (char c : id.to_string()) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

CommImpl::CommImpl(ContextImpl& ctx, int rank, int size) : ctx_(ctx), rank_(rank), size_(size) {}

Result<std::unique_ptr<CommImpl>> CommImpl::create(ContextImpl& ctx, const UniqueId& id, int rank, int size) {
  if (size < 1) return Status(ErrorCode::kInvalidArgument, "communicator size must be at least 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    return Status(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  auto comm = std::unique_ptr<CommImpl>(new CommImpl(ctx, rank, size));
  Status s = comm->setup(id);
  if (!s.ok()) {
    comm->abort();
    return s;
  }
  return comm;
}

Status CommImpl::setup(const UniqueId& id) {
  auto deadline = ctx_.deadline();
  secret_ = id.secret;
  comm_id_ = derive_comm_id(id);
  eager_limit_ = ctx_.config().size("HMC_EAGER_LIMIT");
  eager_window_ = ctx_.config().size("HMC_EAGER_WINDOW");
  credit_wait_ = ctx_.config().duration("HMC_CREDIT_WAIT");
  const std::string rndv = ctx_.config().str("HMC_RNDV");
  // one of the four: Config checks it (core_params' choices)
  rndv_ = rndv == "put" ? Rndv::kPut : rndv == "get" ? Rndv::kGet : rndv == "split" ? Rndv::kSplit : Rndv::kAuto;
  split_min_ = ctx_.config().size("HMC_RNDV_SPLIT");
  turns_min_ = ctx_.config().size("HMC_RNDV_TURNS");
  stage_chunk_ = std::max<std::size_t>(ctx_.config().size("HMC_STAGE_CHUNK"), 4096);
  auto root = parse_root(id.root);
  if (!root) return root.status();
  auto boot = Bootstrap::connect(root->host, root->port, id.secret, rank_, size_, deadline);
  if (!boot) return boot.status();
  bootstrap_ = std::move(boot.value());
  bootstrap_->set_on_change([this] {
    lost_changed_ = true;
    ctx_.engine()->wake();
  });

  // Listen on every net provider and publish the addresses in this rank's card.
  Card mine{rank_, ctx_.host_id(), "", getpid(), ctx_.devices(), {}, {}};
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  mine.hostname = host;
  for (auto& c : ctx_.registry().ccls()) mine.ccls.push_back(c->name);
  for (auto& n : ctx_.registry().nets()) {
    std::vector<uint8_t> addr(HMC_NET_ADDR_MAX);
    std::size_t len = 0;
    void* listener = nullptr;
    int rc = n->net->listen(n->state, bootstrap_->local_ip().c_str(), addr.data(), addr.size(), &len, &listener);
    if (rc != 0) {
      HMC_LOG("core", warn, "net provider {} cannot listen ({}); it is left out of this communicator", n->name,
              provider_error_name(rc));
      continue;
    }
    addr.resize(len);
    listeners_.emplace_back(n.get(), listener);
    mine.nets.push_back({n->name, n->net_caps, addr, n->net_props.latency_us, n->net_props.bandwidth_gbps});
    eager_limit_ = std::min(eager_limit_, n->net_props.max_msg_size - sizeof(WireHeader));
  }
  auto blobs = bootstrap_->allgather(encode_card(mine), deadline);
  if (!blobs) return blobs.status();

  // Negotiate every pair; agree on success before anyone connects, so one rank's
  // failure becomes everyone's clear error instead of a connect timeout.
  auto policy = PathPolicy::parse(ctx_.config().str("HMC_PATH"));
  Status mine_ok = policy ? Status{} : policy.status();
  peers_.resize(size_);
  for (int r = 0; r < size_ && mine_ok.ok(); ++r) {
    auto card = decode_card(blobs.value()[r]);
    if (!card) { mine_ok = card.status(); break; }
    Peer& p = peers_[r];
    p.rank = r;
    p.card = std::move(card.value());
    p.info = p.card.peer_info();
    auto path = negotiate_path(mine, p.card, policy.value());
    if (!path) { mine_ok = path.status(); break; }
    p.path = std::move(path.value());
    p.path.device_path = device_path(mine, p.card, p.path.provider);
    if (p.path.provider != "self") p.net = ctx_.registry().net(p.path.provider);
    const bool same_host = p.card.host_id == mine.host_id;
    p.ipc_ok = p.net && same_host;
    p.path.eager_limit = eager_limit_for(p, same_host);
    p.path.eager_window = eager_window_for(p, same_host);
    p.eager_credit = p.path.eager_window;
    p.path.credit_wait = credit_wait_for(same_host);
    p.path.get_limit = get_limit_for(p, same_host);
    p.path.get_from = get_from_for(p, same_host);
    p.path.split_from = split_from_for(p, same_host);
    p.path.turns_from = turns_from_for(p, same_host);
  }
  std::string verdict = mine_ok.ok() ? "" : mine_ok.to_string();
  auto verdicts = bootstrap_->allgather(std::vector<uint8_t>(verdict.begin(), verdict.end()), deadline);
  if (!verdicts) return verdicts.status();
  for (int r = 0; r < size_; ++r) {
    const auto& v = verdicts.value()[r];
    if (!v.empty())
      return {r == rank_ ? mine_ok.code() : ErrorCode::kUnavailable,
              r == rank_ ? mine_ok.message() : "rank " + std::to_string(r) + " failed to set up: " + std::string(v.begin(), v.end())};
  }
  // Ranks on this machine share its CPUs: the host name counts, not HMC_HOST_ID (which
  // may split one machine into several hosts).
  int here = 0;
  for (auto& p : peers_) here += p.card.hostname == mine.hostname ? 1 : 0;
  const bool helpers =
      std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.net && !(p.net->net_caps & HMC_NET_CAP_POLLED); });
  ctx_.note_host_ranks(here, helpers);
  for (auto& p : peers_)
    HMC_LOG("path", info, "rank {} -> rank {}: {} ({})", rank_, p.rank, p.path.provider, p.path.reason);
  for (auto& p : peers_)
    if (p.net && std::find(polled_.begin(), polled_.end(), p.net) == polled_.end()) polled_.push_back(p.net);
  for (LoadedProvider* n : polled_) {
    n->users.fetch_add(1);
    events_.watch(n->net_events, n->state);
  }
  HMC_RETURN_IF_ERROR(connect_all(id.secret, deadline));
  HMC_RETURN_IF_ERROR(setup_segments(mine, deadline));
  for (auto& p : peers_) {
    if (!p.net) continue;
    p.ctrl.resize(kCtrlSlots);
    for (auto& slot : p.ctrl) {
      slot.buf.resize(sizeof(WireHeader) + std::max(eager_limit_, kCtrlPayloadMin));
      post_ctrl_recv(p, slot);
    }
  }
  ctx_.engine()->add(this);
  registered_ = true;
  return {};
}

std::size_t CommImpl::eager_limit_for(const Peer& p, bool same_host) const {
  if (!p.net || ctx_.config().is_set("HMC_EAGER_LIMIT")) return eager_limit_;
  const hmc_net_props_t& props = p.net->net_props;
  const std::size_t advice = same_host ? props.eager_limit_same_host : props.eager_limit_remote;
  return advice > 0 ? std::min(eager_limit_, advice) : eager_limit_;
}

Status CommImpl::check_hello(const Hello& h, const std::string& provider, const Secret& secret) const {
  if (std::memcmp(h.magic, "HMCHELO", 8) != 0 || h.version != kHelloVersion)
    return {ErrorCode::kRefused, "not an HMC connection"};
  if (!same_secret(h.secret, secret.data())) return {ErrorCode::kRefused, "wrong job secret"};
  if (h.comm_id != comm_id_) return {ErrorCode::kRefused, "belongs to another communicator"};
  if (h.rank < 0 || h.rank >= rank_) return {ErrorCode::kRefused, "unexpected rank " + std::to_string(h.rank)};
  const Peer& p = peers_[h.rank];
  if (!p.lost.ok()) return {ErrorCode::kRefused, "rank " + std::to_string(h.rank) + " was lost: " + p.lost.message()};
  if (p.conn) return {ErrorCode::kRefused, "rank " + std::to_string(h.rank) + " is already connected"};
  if (std::string(h.provider, strnlen(h.provider, sizeof(h.provider))) != provider || p.path.provider != provider)
    return {ErrorCode::kMismatch, "rank " + std::to_string(h.rank) + " connected over " + provider +
                                      " but this rank chose " + p.path.provider + " (HMC_PATH differs between ranks?)"};
  return {};
}

Status CommImpl::connect_all(const Secret& secret, Clock::time_point deadline) {
  // The lower rank of each pair connects; the higher one accepts and authenticates.
  std::size_t expected_in = 0;
  for (auto& p : peers_) {
    if (!p.net) continue;
    if (p.rank < rank_) { ++expected_in; continue; }
    const NetCard* nc = p.card.net(p.path.provider);
    Hello h{};
    std::memcpy(h.magic, "HMCHELO", 8);
    h.version = kHelloVersion;
    h.rank = rank_;
    std::memcpy(h.secret, secret.data(), 16);
    h.comm_id = comm_id_;
    std::strncpy(h.provider, p.path.provider.c_str(), sizeof(h.provider) - 1);
    int rc = p.net->net->connect(p.net->state, nc->address.data(), nc->address.size(), &h, sizeof(h), &p.conn);
    if (rc != 0)
      return {ErrorCode::kPeerLost, "connecting to " + describe(p) + " failed: " + provider_error_name(rc) + " (the " +
                                        p.path.provider + " provider's log line before this says why)"};
  }
  std::size_t accepted = 0;
  while (true) {
    for (auto& [net, listener] : listeners_) {
      void* conn = nullptr;
      // Room for any hello a provider carries: a stranger's longer one is refused here,
      // not left at the head of the provider's queue for a larger buffer.
      static_assert(sizeof(Hello) <= HMC_NET_HELLO_MAX);
      std::array<uint8_t, HMC_NET_HELLO_MAX> raw{};
      std::size_t hello_len = 0;
      if (net->net->accept(net->state, listener, &conn, raw.data(), raw.size(), &hello_len) != 0 || !conn) continue;
      Hello h{};
      Status ok{ErrorCode::kRefused, "malformed hello (" + std::to_string(hello_len) + " bytes)"};
      if (hello_len == sizeof(h)) {
        std::memcpy(&h, raw.data(), sizeof(h));
        ok = check_hello(h, net->name, secret);
      }
      if (!ok.ok()) {
        HMC_LOG("core", warn, "refused a {} connection: {}", net->name, ok.message());
        net->net->close_conn(net->state, conn);
        if (ok.code() == ErrorCode::kMismatch) return ok;
        continue;
      }
      peers_[h.rank].conn = conn;
      ++accepted;
    }
    // Both ways: an accepted connection whose hello passed is set up (ucx creates its
    // endpoint only now, net.h) and ready once conn_status says so.
    bool all_up = true;
    for (auto& p : peers_) {
      if (!p.net || !p.conn) continue;
      int st = p.net->net->conn_status(p.net->state, p.conn);
      if (st < 0)
        return {ErrorCode::kPeerLost, (p.rank > rank_ ? "connecting to " : "the connection from ") + describe(p) +
                                          " failed: " + provider_error_name(st) + " (the " + p.path.provider +
                                          " provider's log lines say why; on the peer's side too)"};
      all_up &= st == 0;
    }
    if (all_up && accepted == expected_in) return {};
    // A peer the control plane lost (it failed its own set-up, or died) will not come:
    // say so now rather than at HMC_TIMEOUT.
    if (lost_changed_.load(std::memory_order_relaxed))
      for (int r : bootstrap_->lost_peers()) {
        const Peer& p = peers_[r];
        if (r != rank_ && p.net && (!p.conn || p.net->net->conn_status(p.net->state, p.conn) != 0))
          return {ErrorCode::kPeerLost, describe(p) + " left the job while the connections were set up (its own "
                                                      "error is in its output)"};
      }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (auto& p : peers_)
        if (p.net && (!p.conn || p.net->net->conn_status(p.net->state, p.conn) != 0))
          missing += " " + std::to_string(p.rank);
      return {ErrorCode::kTimeout, "connections to ranks" + missing + " not established before HMC_TIMEOUT"};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string CommImpl::control_ip() const { return bootstrap_ ? bootstrap_->local_ip() : std::string(); }

std::string CommImpl::describe(const Peer& p) const {
  return "rank " + std::to_string(p.rank) + " (" + p.card.hostname + ", pid " + std::to_string(p.card.pid) + ", " +
         p.path.provider + ")";
}

Status CommImpl::usable() const {
  switch (state_.load()) {
    case 0: return {};
    case 1: return {ErrorCode::kFinalized, "communicator used after finalize()"};
    default: return {ErrorCode::kAborted, "communicator was aborted"};
  }
}

Status CommImpl::barrier() {
  HMC_RETURN_IF_ERROR(usable());
  return answering_barrier(ctx_.deadline(), "hmc-barrier");
}

// The control plane's barrier on a thread of its own while this one keeps making progress:
// a peer may need this rank's answer before it can reach the barrier (the CTS of a
// rendezvous it sends here, eager credit, a refusal), and would otherwise hold everyone
// until the deadline.
Status CommImpl::answering_barrier(Clock::time_point deadline, const char* thread_name) {
  std::atomic<bool> done{false};
  Status s;
  try {
    std::thread barrier([&] {
      pthread_setname_np(pthread_self(), thread_name);
      s = bootstrap_->barrier(deadline);
      done = true;
      ctx_.engine()->wake();
    });
    ctx_.engine()->wait_until([&] { return done.load(); }, Clock::time_point::max());
    barrier.join();
  } catch (const std::system_error&) {  // no thread to be had: the barrier without answering
    s = bootstrap_->barrier(deadline);
  }
  return s;
}

void CommImpl::fail_all(const Status& why) {
  dev_.finish_all(why);
  for (auto& p : peers_) fail_pending(p, why);
}

void CommImpl::fail_pending(Peer& p, const Status& why) {
  for (auto& h : p.held) h.op->fail(why);
  p.held.clear();
  for (auto& r : p.posted) r.op->fail(why);
  for (auto& [id, s] : p.rndv_sends) {
    release_reg(p, s.reg);
    s.op->fail(why);
  }
  p.posted.clear();
  p.rndv_sends.clear();
  for (auto it = p.rndv_recvs.begin(); it != p.rndv_recvs.end();) {
    RecvOp& r = it->second;
    if (r.getting) {
      // A get still writes into the user's buffer: the receive fails when the provider ends
      // it (close_conn fails it; on_got), not before.
      if (r.error.ok()) r.error = why;
      ++it;
      continue;
    }
    if (r.copies > 0) {
      // Staged parts are still being copied into the user's buffer: the receive ends when
      // they do (on_chunk's callback), not before, or a buffer the user took back as
      // failed would still be written; failed unless its FIN came (all its bytes are
      // here). fail_all ends every copy before it gets here.
      if (!r.fin && r.error.ok()) r.error = why;
      r.fin = true;
      ++it;
      continue;
    }
    release_recv(p, r);
    r.op->fail(why);
    it = p.rndv_recvs.erase(it);
  }
}

void CommImpl::close_connections() {
  for (auto& p : peers_) {
    // The handle goes with the connection (as in mark_lost): nothing below may use it again.
    if (p.net && p.conn) p.net->net->close_conn(p.net->state, std::exchange(p.conn, nullptr));
  }
  // Closed connections (here, or earlier when the peer was lost) fail their requests:
  // collect them so nothing leaks, for 2 s at most in all (under mu_), every peer in turn.
  const auto until = Clock::now() + std::chrono::seconds(2);
  auto pending = [](Peer& p) {
    return p.net && (!p.inflight.empty() || std::any_of(p.ctrl.begin(), p.ctrl.end(), [](auto& s) { return s.req; }));
  };
  for (bool more = true; more;) {
    more = false;
    for (auto& p : peers_)
      if (pending(p)) {
        progress_peer(p);
        more |= pending(p);
      }
    if (Clock::now() >= until) break;
  }
  flush_reg_cache(true);
  for (auto& [net, listener] : listeners_) net->net->close_listener(net->state, listener);
  listeners_.clear();
  for (LoadedProvider* n : polled_) n->users.fetch_sub(1);
  polled_.clear();
  events_.clear();
}

// A caller of abort() returns once nothing touches its buffers any more (request.h), so a
// second caller, or the destructor on another thread, waits for the first one's closing:
// it ends the vendor link and drops collectives (the hooks) only after mu_ is let go.
void CommImpl::wait_abort_done() {
  if (aborting_.load() == std::this_thread::get_id()) return;  // from inside a hook
  std::unique_lock lock(abort_mu_);
  // A warning each HMC_TIMEOUT, at most one a second (HMC_TIMEOUT may be a millisecond).
  const auto every = std::max<std::chrono::milliseconds>(ctx_.timeout(), std::chrono::seconds(1));
  while (!abort_cv_.wait_for(lock, every, [this] { return abort_done_; }))
    HMC_LOG("core", warn, "rank {}: abort() still waits for another thread's abort() to end (its vendor "
            "library's abort, or collectives being dropped)", rank_);
}

void CommImpl::abort() {
  bool unregister = false;
  {
    std::unique_lock lock(mu_);
    if (state_.load() == 2) {
      lock.unlock();
      wait_abort_done();
      return;
    }
    aborting_ = std::this_thread::get_id();
    bool was_active = state_.exchange(2) == 0;
    unregister = std::exchange(registered_, false);
    if (bootstrap_ && was_active) bootstrap_->abort();
    // Connections first: a peer still putting into a receive of ours then sees this rank
    // gone (kPeerLost) rather than a put refused by a region released under it.
    close_connections();
    fail_all({ErrorCode::kAborted, "communicator was aborted"});
    if (segments_) segments_->fail({ErrorCode::kAborted, "communicator was aborted"});
  }
  // Not under mu_: remove() waits for passes in flight, and one of them may be waiting
  // for mu_ (the collectives' driver posts through this communicator). Until then a pass
  // that calls progress() finds the communicator closed and leaves.
  if (unregister) ctx_.engine()->remove(this);
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(upper_mu_);
    hooks.swap(abort_hooks_);
  }
  for (auto& hook : hooks) hook();
  ctx_.engine()->wake();
  aborting_ = std::thread::id{};
  // Under the lock: a waiter (the destructor) cannot go on, and free this, before the
  // notification is out.
  std::lock_guard lock(abort_mu_);
  abort_done_ = true;
  abort_cv_.notify_all();
}

Status CommImpl::finalize() {
  if (state_.load() == 2) wait_abort_done();
  HMC_RETURN_IF_ERROR(usable());
  auto deadline = ctx_.deadline();
  // A rendezvous that came for a receive this rank never posted is refused now, and one
  // that comes later as it arrives: its sender's drain below waits for it otherwise (two
  // ranks that each left the other one waited for each other), and the barrier then
  // fails both at the deadline.
  {
    std::lock_guard lock(mu_);
    refuse_unreceived_ = true;
    for (auto& p : peers_) {
      std::erase_if(p.unexpected, [&](const Unexpected& u) {
        if (u.type != MsgType::kRts) return false;
        if (p.lost.ok()) refuse_unreceived(p, u.sender_id, u.size);
        return true;
      });
    }
  }
  // Let in-flight sends drain, then agree that everyone is done before closing anything.
  const bool drained = ctx_.engine()->wait_until([&] {
    std::lock_guard lock(mu_);
    if (dev_.busy()) return false;
    for (auto& p : peers_)
      if (!p.inflight.empty() || !p.rndv_sends.empty() || !p.held.empty()) return false;
    return true;
  }, deadline);
  if (!drained) {
    std::lock_guard lock(mu_);
    std::string what;
    for (auto& p : peers_)
      if (!p.inflight.empty() || !p.rndv_sends.empty() || !p.held.empty())
        what += " rank " + std::to_string(p.rank) + ": " + std::to_string(p.inflight.size()) + " messages, " +
                std::to_string(p.rndv_sends.size()) + " rendezvous sends, " + std::to_string(p.held.size()) +
                " sends waiting for credit;";
    HMC_LOG("core", warn, "finalize: sends still pending at the deadline (device copies busy: {}):{}", dev_.busy(), what);
  }
  // This rank keeps answering its peers during the barrier: a peer still draining may be
  // waiting for the refusal of a rendezvous send that only reaches us now (its receive
  // here failed or never came).
  // A peer released from the barrier first closes its connections, which this rank may see
  // before its own release: no warning for that (a peer that really died fails the barrier).
  finalizing_ = true;
  Status s = answering_barrier(deadline, "hmc-finalize");
  Status bye;
  bool unregister = false;
  {
    std::unique_lock lock(mu_);
    // abort() from another thread ended the barrier and did the closing: it stays aborted.
    if (state_.load() == 2) {
      lock.unlock();
      wait_abort_done();
      return {ErrorCode::kAborted, "communicator was aborted during finalize()"};
    }
    state_ = 1;
    fail_all({ErrorCode::kFinalized, "communicator finalized while the operation was pending"});
    if (segments_) segments_->fail({ErrorCode::kFinalized, "communicator finalized while the operation was pending"});
    unregister = std::exchange(registered_, false);
    bye = bootstrap_->finalize(deadline);
    close_connections();
  }
  if (unregister) ctx_.engine()->remove(this);  // not under mu_, as in abort()
  return s.ok() ? bye : s;
}

std::shared_ptr<void> CommImpl::upper_state(const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard lock(upper_mu_);
  if (!upper_) upper_ = make();
  return upper_;
}

void CommImpl::keep_until_destroyed(std::shared_ptr<void> buffers) {
  std::lock_guard lock(upper_mu_);
  kept_.push_back(std::move(buffers));
}

void CommImpl::on_abort(std::function<void()> fn) {
  {
    std::lock_guard lock(upper_mu_);
    if (state_.load() != 2) {
      abort_hooks_.push_back(std::move(fn));
      return;
    }
  }
  fn();  // aborted already (its hooks may have run): at once
}

CommImpl::~CommImpl() {
  if (state_.load() == 0) HMC_LOG("core", info, "communicator destroyed without finalize(); peers will see rank {} lost", rank_);
  abort();
}

}  // namespace hmc::core
