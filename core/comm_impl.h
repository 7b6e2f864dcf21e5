// CommImpl: one communicator's peers, paths, connections and point-to-point engine.
//
// Tag matching and rendezvous are built on the net ABI's ordered messages and puts:
//   - up to the peer's eager limit (HMC_EAGER_LIMIT, or lower where the path provider
//     advises it for the pair class) bytes travel inside one EAGER message;
//   - larger ones: RTS -> receiver registers its buffer -> CTS(rkey) -> sender puts the
//     data and sends FIN; FIN arrives after the data is visible (the ABI's ordering);
//   - or, where the path provider can get and HMC_RNDV allows it (rndv_get.cpp): RTS with
//     the sender's registered buffer's rkey -> receiver gets the data -> GET_DONE;
//   - or, on one host from HMC_RNDV_SPLIT up, both (rndv_split.cpp): RTS with the sender's
//     key -> CTS with the receiver's -> the sender puts the first half while the receiver
//     gets the second -> FIN and GET_DONE: both ranks copy at once;
//   - eager messages are flow-controlled (eager_credit.cpp): past the pair's eager
//     window of bytes its receiver has not consumed yet, a small message waits for the
//     receiver's credit (up to HMC_CREDIT_WAIT), then goes by rendezvous.
// A receive matches the first message of the same peer and tag, in order.
// All state is guarded by mu_; progress() takes it with try_lock so any waiting thread
// can drive it. Lock order: CommImpl::mu_, then ProgressEngine's.
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/bootstrap.h"
#include "core/card.h"
#include "core/context_impl.h"
#include "core/device_path.h"
#include "core/events_watch.h"
#include "core/host_segments.h"
#include "core/progress.h"
#include "core/registration.h"
#include "core/wire.h"
#include "hmc/communicator.h"

namespace hmc::core {

// A provider's error code and message as a Status naming `who` (p2p.cpp).
Status from_provider(int rc, const char* msg, const std::string& who);
// kInvalidArgument, its text after `what`, where `bytes` from `ptr` run past the address space.
Status check_extent(const void* ptr, std::size_t bytes, const char* what);

// A callback for each part of a send (a put, the FIN behind it, ...): the first failure
// fails `op`, and once *parts of them ran without one, `op` completes with `bytes`.
std::function<void(const Status&)> parts_of(std::shared_ptr<Operation> op, std::shared_ptr<int> parts, std::size_t bytes);

class CommImpl : public Progressable {
 public:
  static Result<std::unique_ptr<CommImpl>> create(ContextImpl& ctx, const UniqueId& id, int rank, int size);
  ~CommImpl() override;

  int rank() const { return rank_; }
  // This rank's address on its connection to the bootstrap root ("" without one).
  std::string control_ip() const;
  int size() const { return size_; }
  ContextImpl& context() { return ctx_; }
  const PeerInfo& peer_info(int r) const { return peers_[r].info; }
  const PathInfo& path(int r) const { return peers_[r].path; }

  // Tags with the top bit set are reserved for collectives (any tag is accepted here).
  std::shared_ptr<Operation> isend(const void* buf, std::size_t bytes, int peer, uint64_t tag);
  std::shared_ptr<Operation> irecv(void* buf, std::size_t bytes, int peer, uint64_t tag);
  // Takes a receive that no message has matched yet off the peer's posted list and fails
  // it with `why`: nothing writes into its buffer any more. False where a message already
  // matched it (its data may still be landing), or it ended.
  bool withdraw_recv(int peer, const std::shared_ptr<Operation>& op, const Status& why);
  Result<MemoryRegion> register_memory(void* ptr, std::size_t bytes);
  std::shared_ptr<Operation> put(int peer, const void* src, std::size_t bytes, const RemoteKey& key,
                                 uint64_t offset, std::optional<uint64_t> notify);
  Result<uint64_t> wait_notify(int peer, Clock::time_point deadline);
  Status barrier();
  void abort();
  Status finalize();
  // Ok while usable; kFinalized / kAborted afterwards.
  Status usable() const;

  bool progress() override;

  // The shared segments of collectives on one host (host_segments.h), or null: then no rank of
  // this communicator has them.
  const std::shared_ptr<HostSegments>& segments() const { return segments_; }

  // One slot for the layer above (the collectives' sequence counter, scratch pool, vendor
  // CCL communicator): made by `make` on first use, destroyed with the communicator.
  std::shared_ptr<void> upper_state(const std::function<std::shared_ptr<void>()>& make);
  // Buffers of an exchange of the layers above whose wait failed (split, the vendor
  // library's agreement): its operations may still be posted and write into them, so they
  // live until this communicator is destroyed, after abort() closed its connections.
  void keep_until_destroyed(std::shared_ptr<void> buffers);
  // Called by abort() once this communicator's own operations failed, outside its locks:
  // the layers above end what they run beside it (the vendor library's collectives).
  void on_abort(std::function<void()> fn);

 private:
  // The control plane's barrier, run while this thread keeps making progress.
  Status answering_barrier(Clock::time_point deadline, const char* thread_name);
  // A buffer's registration with a peer's provider: a cached one, or one of its own.
  struct Reg {
    void* mr = nullptr;      // a registration of this operation alone
    std::size_t cached = 0;  // 1 + index into reg_cache_, or 0
  };
  struct SendOp {
    std::shared_ptr<Operation> op;
    const uint8_t* buf;
    std::size_t bytes;
    bool device = false;       // buf is device memory: stage or write through IPC
    uint8_t* staged = nullptr; // pinned host copy while a staged put is in flight
    Reg reg{};                 // buf, registered for the receiver to get (kRtsGet)
    // A split send (kCtsSplit): its parts still to end (the head's put, its FIN, the
    // receiver's kGetDone) and what ends one; null otherwise.
    std::shared_ptr<int> split_parts{};
    std::function<void(const Status&)> split_done{};
  };
  // A send waiting for eager credit (eager_credit.cpp), or queued behind one.
  struct HeldSend {
    std::shared_ptr<Operation> op;
    const uint8_t* buf;
    std::size_t bytes;
    uint64_t tag;
    bool device;
    Clock::time_point until;  // then it goes by rendezvous if credit has not come
  };
  struct RecvOp {
    std::shared_ptr<Operation> op;
    uint8_t* buf;
    std::size_t bytes;
    uint64_t tag;
    uint64_t id;
    Reg reg{};
    bool getting = false;      // a get into buf is under way (kRtsGet)
    bool device = false;       // buf is device memory
    uint8_t* staged = nullptr; // host buffer the data lands in first (device receives)
    uint64_t ipc_key = 0;      // offer_key of buf as the CTS offered it over IPC; 0: not offered
    bool chunked = false;      // kChunk messages came: staged parts are copied as they land
    int copies = 0;            // staged parts still being copied to buf
    bool fin = false;          // kFin came while copies ran: finish when they end
    uint64_t fin_size = 0;
    Status error{};            // a part's copy failed
    int parts = 0;             // a split receive: its parts still to end (the head's FIN, its get)
    std::size_t head = 0;      // a split receive: where its own part starts
    std::vector<uint8_t> key{};  // a split receive: buf's key, for a CTS should its get fail
  };
  struct RegCacheEntry {
    LoadedProvider* net;
    void* ptr;
    std::size_t len;
    void* mr;
    std::vector<uint8_t> rkey;
    int in_use;
    bool stale;
  };
  static constexpr std::size_t kRegCacheMax = 256;
  struct Unexpected {
    MsgType type;
    uint64_t tag;
    uint64_t size;
    uint64_t sender_id;
    uint64_t aux;  // kRts flags
    std::vector<uint8_t> data;  // kEager: the message; kRts with kRtsGet: the sender's rkey
  };
  // What a provider request's end does: runs `done` where set; else fails `op` if the request
  // failed and, where `completes`, completes it with `bytes` if not. The common sends take
  // the second form: a std::function holding a shared_ptr is a heap block per message.
  struct OnEnd {
    std::function<void(const Status&)> done;
    std::shared_ptr<Operation> op;
    std::size_t bytes = 0;
    bool completes = false;
    OnEnd() = default;
    OnEnd(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
    template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, OnEnd> &&
                                                std::is_invocable_v<F&, const Status&>>>
    OnEnd(F f) : done(std::move(f)) {}  // NOLINT(google-explicit-constructor)
    static OnEnd fails(std::shared_ptr<Operation> op) { return with(std::move(op), 0, false); }
    static OnEnd completes_with(std::shared_ptr<Operation> op, std::size_t bytes) { return with(std::move(op), bytes, true); }
    void operator()(const Status& s) const;

   private:
    static OnEnd with(std::shared_ptr<Operation> op, std::size_t bytes, bool completes);
  };
  struct MsgBuf;
  // A provider request in flight, what to do when it ends, and the wire buffer of a
  // message, kept until the provider is done with it.
  struct Inflight {
    void* req;
    OnEnd end;
    std::shared_ptr<MsgBuf> msg{};
  };
  struct PendingNotify {
    uint64_t value;
    enum { kWaiting, kReady, kDropped } state;
    OnEnd done;  // ends the put's operation with how its NOTIFY went
  };
  struct CtrlSlot {
    std::vector<uint8_t> buf;
    void* req = nullptr;
  };
  struct Peer {
    int rank = -1;
    Card card;
    PeerInfo info;
    PathInfo path;
    LoadedProvider* net = nullptr;  // null for self
    void* conn = nullptr;
    Status lost;  // ok while alive
    // The connection failed (lose()): marked lost at the end of the next progress_peer,
    // once the messages it had delivered before are taken.
    Status ending;
    // The control plane lost the peer: until when its connection may still deliver (p2p.cpp).
    std::optional<Clock::time_point> leaving;
    std::vector<CtrlSlot> ctrl;
    std::size_t next_ctrl = 0;
    bool repost = false;  // some ctrl slots took a message and wait to be posted again
    // The last get-band rendezvous received from this peer, for taking turns (rndv_get.cpp).
    struct {
      const uint8_t* buf = nullptr;
      std::size_t len = 0;
      bool by_put = false;
    } last_rndv;
    std::deque<RecvOp> posted;
    std::deque<Unexpected> unexpected;
    std::map<uint64_t, SendOp> rndv_sends;
    std::map<uint64_t, RecvOp> rndv_recvs;
    std::deque<uint64_t> notifications;
    // Notifications asked for with puts still under way, in the order asked: each goes out
    // once its put completed and every earlier one went; a failed put's is dropped.
    std::deque<std::shared_ptr<PendingNotify>> notify_after;
    std::vector<Inflight> inflight;
    std::vector<Inflight> inflight_scan;  // progress_peer's working copy (keeps its capacity)
    // IPC stays on for a pair until this many imports failed: one refused allocation (a
    // driver that still maps a freed one at its address, a hash collision) is staged alone.
    static constexpr int kIpcStrikes = 8;
    bool ipc_ok = false;  // same host, and fewer than kIpcStrikes IPC imports failed
    // IPC imports of the peer's memory this side could not make (as sender), or that the
    // peer refused (as receiver: offer_key of each refused buffer, never offered again).
    int ipc_strikes = 0;
    std::set<uint64_t> ipc_refused;
    // Eager flow control (eager_credit.cpp): what this side may still send eagerly, and
    // what of the peer's eager messages was consumed here and not yet given back.
    std::size_t eager_credit = 0;
    std::size_t credit_owed = 0;
    std::deque<HeldSend> held;  // sends waiting for credit, and every later send, in order
  };

  CommImpl(ContextImpl& ctx, int rank, int size);
  Status setup(const UniqueId& id);
  Status connect_all(const Secret& secret, Clock::time_point deadline);
  Status check_hello(const Hello& h, const std::string& provider, const Secret& secret) const;
  void post_ctrl_recv(Peer& p, CtrlSlot& slot);
  // Posts again the control slots that took a message (Peer::repost), in ring order from
  // next_ctrl: the provider fills receives in the order they were posted. A pass leaves
  // that to the next one unless it comes round the whole ring: the pass that completed a
  // receive then returns to its waiter sooner (8 B half round trip over ucx on shared
  // memory 0.82-0.88 -> 0.77-0.83 us polled), and the provider holds what arrives meanwhile.
  void repost_ctrl(Peer& p);
  // The largest message sent to `p` eagerly (PathInfo::eager_limit): HMC_EAGER_LIMIT where
  // the user set it, else the lower of it and the path provider's advice for the pair class.
  // Only ever lower than eager_limit_, which sizes every receiver's control slots.
  std::size_t eager_limit_for(const Peer& p, bool same_host) const;

  // p2p engine (p2p.cpp)
  // Starts a send to a net peer now: eagerly where it may and the window has room, else by
  // rendezvous.
  void start_send(Peer& p, const std::shared_ptr<Operation>& op, const uint8_t* buf, std::size_t bytes,
                  uint64_t tag, bool device);
  // Whether a send of `bytes` to p travels inside one message, credit permitting.
  bool eager_sized(const Peer& p, std::size_t bytes, bool device) const;
  // Device bytes that travel inside a message are copied to the host first: into `host`,
  // and `data` then points there.
  Status via_host(const uint8_t*& data, std::size_t bytes, std::vector<uint8_t>& host);
  void post_msg(Peer& p, MsgType type, uint64_t tag, uint64_t id, uint64_t size, uint64_t aux,
                const void* payload, std::size_t payload_len, OnEnd end);
  // Keeps a provider request until it ends; a call that failed at once (rc, or no request)
  // runs `done` with the error now and returns it.
  Status track(Peer& p, int rc, void* req, OnEnd end, const char* what, std::shared_ptr<MsgBuf> msg = nullptr);
  // Tests `req` once: when it ended, runs `done` with how (a lost connection: lose()) and
  // returns true; false while it is pending (the request is then still the caller's).
  bool ended(Peer& p, void* req, const OnEnd& end);
  void handle_msg(Peer& p, const uint8_t* buf, std::size_t len);
  void deliver_eager(Peer& p, RecvOp& r, const uint8_t* data, std::size_t size);
  // Once finalize() began: refuses a rendezvous nobody here will receive,
  // so that its sender's finalize does not wait for it until the deadline.
  void refuse_unreceived(Peer& p, uint64_t sender_id, uint64_t size);
  // Answers an RTS that `r` matched; `key` is the payload of a kRtsGet (else empty).
  void start_rndv_recv(Peer& p, RecvOp r, uint64_t sender_id, uint64_t size, uint64_t rts_flags,
                       const uint8_t* key = nullptr, std::size_t key_len = 0);
  // Registers [ptr, ptr + size) with p's provider (cached for HMC allocations) and packs its
  // key. With `cached_only`, memory outside HMC allocations is refused (kUnsupported).
  Status register_buffer(Peer& p, uint8_t* ptr, std::size_t size, Reg& reg, std::vector<uint8_t>& rkey,
                         bool cached_only = false);
  void release_reg(Peer& p, Reg& reg);
  // Eager flow control (eager_credit.cpp). The pair's window (PathInfo::eager_window):
  std::size_t eager_window_for(const Peer& p, bool same_host) const;
  std::chrono::microseconds credit_wait_for(bool same_host) const;
  // Sender: whether a message of `bytes` may go eagerly now; spend_eager_credit charges it.
  bool eager_fits(const Peer& p, std::size_t bytes) const;
  void spend_eager_credit(Peer& p, std::size_t bytes);
  // Receiver: an eager message of `bytes` from p reached a receive; give_back_credit sends
  // p what is owed (at a quarter of the window, and whenever p sends an RTS).
  void consumed_eager(Peer& p, std::size_t bytes);
  void give_back_credit(Peer& p);
  void on_credit(Peer& p, uint64_t bytes);  // sender: the peer gave back `bytes` (kCredit)
  // Sender: whether a send must wait in p.held (one waits already, or it is eager-sized and
  // short of credit), and starting the held sends whose credit came or whose wait ended.
  bool must_hold(const Peer& p, std::size_t bytes, bool device) const;
  bool short_of_credit(const Peer& p, std::size_t bytes, bool device) const;  // eager-sized, window full
  bool release_held(Peer& p);
  // Receiver-driven rendezvous (rndv_get.cpp). Up to which size p uses it for sends, from
  // HMC_RNDV and the provider's advice for the pair class (0: never):
  std::size_t get_limit_for(const Peer& p, bool same_host) const;
  // From which size it uses it again (the provider's second band; SIZE_MAX: none).
  std::size_t get_from_for(const Peer& p, bool same_host) const;
  // Sender: registers s's buffer and packs its key for a kRtsGet; false: a plain kRts.
  bool offer_get(Peer& p, SendOp& s, std::vector<uint8_t>& rkey);
  // Receiver: starts the get of a kRtsGet into r's buffer (r moves to p.rndv_recvs); false
  // when it cannot (r untouched): the caller answers with a CTS instead.
  bool start_get(Peer& p, RecvOp& r, uint64_t sender_id, const uint8_t* key, std::size_t key_len);
  void on_got(Peer& p, uint64_t id, uint64_t sender_id, const Status& s);
  // Split rendezvous (rndv_split.cpp): from which size p uses it (SIZE_MAX: never); the
  // receiver's start (false when it cannot: r untouched) and the sender's answer to its CTS.
  std::size_t split_from_for(const Peer& p, bool same_host) const;
  std::size_t turns_from_for(const Peer& p, bool same_host) const;
  // Whether the receive r, matched to an RTS that offers a get, is the sender's turn to
  // copy (PathInfo::turns_from, kRtsTurn); records it as the peer's last either way.
  bool senders_turn(Peer& p, const RecvOp& r, uint64_t rts_flags);
  // Whether this rank has a rendezvous of that kind under way with any peer (rndv_sends or
  // rndv_recvs): then its core has copies of its own, and HMC_RNDV=auto does not split.
  template <class Op>
  bool busy_with(std::map<uint64_t, Op> Peer::*what) const {
    return rndv_ != Rndv::kSplit &&
           std::any_of(peers_.begin(), peers_.end(), [&](const Peer& q) { return !(q.*what).empty(); });
  }
  bool start_split(Peer& p, RecvOp& r, uint64_t sender_id, const uint8_t* key, std::size_t key_len);
  void on_split_cts(Peer& p, const WireHeader& h, const uint8_t* rkey, std::size_t rkey_len);
  void on_get_done(Peer& p, const WireHeader& h);
  // Takes the send `id` out of p.rndv_sends (its buffer's registration released); nullopt if gone.
  std::optional<SendOp> take_send(Peer& p, uint64_t id);
  std::optional<IpcOffer> ipc_offer(const Peer& p, const RecvOp& r, uint64_t rts_flags);
  void on_cts_ipc(Peer& p, const WireHeader& h, const uint8_t* payload, std::size_t len);
  void on_cts_refused(Peer& p, const WireHeader& h, const uint8_t* payload, std::size_t len);
  void finish_rndv_recv(Peer& p, uint64_t id, uint64_t size);
  Status copy_in(void* dst, const void* src, std::size_t bytes, bool device);
  void release_recv(Peer& p, RecvOp& r);
  void flush_reg_cache(bool all);
  void on_cts(Peer& p, const WireHeader& h, const uint8_t* rkey, std::size_t rkey_len);
  // A send staged on either side moves in chunks of stage_chunk_, each put followed by
  // kChunk: from a device, each chunk's copy to pinned host memory runs on a stream while
  // the previous chunk is put; into a device, the receiver copies each chunk as it lands.
  void send_staged(Peer& p, const SendOp& s, uint64_t receiver_id, std::vector<uint8_t> rkey);
  void on_chunk(Peer& p, uint64_t id, uint64_t offset, uint64_t len);
  // Tells the receiver of a rendezvous this side cannot complete why its receive fails
  // (kCtsRefused with the error code), unless the peer is lost or the communicator closing.
  void fail_receiver(Peer& p, uint64_t receiver_id, const Status& why);
  void mark_lost(Peer& p, Status why);
  // The provider says p's connection failed: mark_lost once what it delivered before is
  // taken, at the end of the next progress_peer (Peer::ending).
  void lose(Peer& p, const Status& why);
  Status aborted_if_closing(Status s) const;
  // Sends the NOTIFYs at the head of p.notify_after whose puts completed (put.cpp).
  void release_notifies(Peer& p);
  // A NOTIFY whose put has ended: sent now, or queued behind those still waiting for theirs.
  void notify_after_puts(Peer& p, uint64_t value, OnEnd done);
  void send_notify(Peer& p, uint64_t value, OnEnd done);
  Status setup_segments(const Card& mine, Clock::time_point deadline);
  bool progress_peer(Peer& p);
  bool progress_peer_pass(Peer& p);  // one pass of progress_peer's work
  void fail_all(const Status& why);
  // Fails (and forgets) p's posted receives and rendezvous under way.
  void fail_pending(Peer& p, const Status& why);
  void close_connections();
  std::string describe(const Peer& p) const;

  ContextImpl& ctx_;
  int rank_;
  int size_;
  uint64_t comm_id_ = 0;
  std::size_t eager_limit_ = 64 * 1024;
  std::size_t eager_window_ = 256 << 10;  // HMC_EAGER_WINDOW; 0: unbounded
  std::chrono::microseconds credit_wait_{};  // HMC_CREDIT_WAIT
  std::size_t stage_chunk_ = 4 << 20;  // HMC_STAGE_CHUNK
  enum class Rndv { kAuto, kPut, kGet, kSplit } rndv_ = Rndv::kAuto;  // HMC_RNDV
  std::size_t split_min_ = 0;  // HMC_RNDV_SPLIT; 0: never
  std::size_t turns_min_ = 0;  // HMC_RNDV_TURNS; 0: never
  // Staging buffers of receives that ended while chunk copies still read them: how many
  // copies each waits for before it is released.
  std::unordered_map<uint8_t*, int> draining_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<Peer> peers_;
  std::vector<std::pair<LoadedProvider*, void*>> listeners_;
  // The net providers of this communicator's peers, each counted once in its `users`
  // (setup) until close_connections.
  std::vector<LoadedProvider*> polled_;
  EventsWatch events_;  // polled_'s `events` counts: whether a pass tests the peers (mu_)
  Secret secret_{};
  mutable std::mutex mu_;
  std::atomic<bool> lost_changed_{false};
  int leaving_ = 0;  // peers with `leaving` set (mu_)
  std::atomic<int> state_{0};  // 0 active, 1 finalized, 2 aborted
  // abort()'s closing is over (set last, after the hooks); the thread doing it meanwhile.
  // A second abort(), a finalize() it overtook, and the destructor wait for it.
  std::mutex abort_mu_;
  std::condition_variable abort_cv_;
  bool abort_done_ = false;  // abort_mu_
  std::atomic<std::thread::id> aborting_{};
  void wait_abort_done();
  std::atomic<bool> finalizing_{false};  // finalize reached its barrier
  std::atomic<bool> refuse_unreceived_{false};  // finalize began: an unmatched RTS is refused
  uint64_t next_id_ = 1;
  bool registered_ = false;
  // Wire buffers of post_msg: one stays with its send until the provider completed it
  // (the in-flight callback holds a reference), then the next message takes it again
  // instead of allocating and faulting in fresh memory (up to kMsgBufsKept; mu_).
  struct MsgBuf {
    std::unique_ptr<uint8_t[]> bytes;
    std::size_t cap = 0;
  };
  std::shared_ptr<MsgBuf> take_msg_buf(std::size_t len);
  std::vector<std::shared_ptr<MsgBuf>> msg_bufs_;
  std::vector<RegCacheEntry> reg_cache_;
  uint64_t reg_cache_gen_ = 0;
  DeviceTransfers dev_{ctx_};
  std::shared_ptr<HostSegments> segments_;
  std::mutex upper_mu_;
  std::shared_ptr<void> upper_;
  std::vector<std::shared_ptr<void>> kept_;  // upper_mu_
  std::vector<std::function<void()>> abort_hooks_;  // upper_mu_
};

}  // namespace hmc::core
