// Provider state of the ucx net provider: one ucp_context and one worker, the
// lifeline sockets, the connection, listener and region tables, and a thread
// that sleeps on the worker's event fd and the sockets.
//
// Threads and locking. The worker runs in UCS_THREAD_MODE_SERIALIZED: every
// UCP call and every callback UCP makes happens under mu_, whichever thread
// (the host's caller, the host's progress engine through progress(), or the
// provider thread) holds it. One lock covers UCP and the tables because UCP's
// callbacks touch the tables. progress() only try_locks, so a waiter never
// queues behind another thread's progress. Requests are hmc_net::Request
// objects (net-providers/common): completed under mu_, polled by test()
// without it. host->wake is called after mu_ is released.
//
// The thread is what makes a put into this process complete while its host
// is busy elsewhere: UCX emulates puts into malloc memory over shared memory
// with active messages that the target must progress, and the put check
// (put.cpp) needs the target to answer.
#pragma once

#include <sys/epoll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/host.h"
#include "common/port_range.h"
#include "common/request.h"
#include "common/strangers.h"
#include "hmc/provider/net.h"
#include "lifeline.h"

namespace hmc_ucx {

using hmc_net::Request;
using Clock = std::chrono::steady_clock;

// The provider's parameters (read in Provider::start, listed in the ABI table).
inline constexpr hmc_param_t kParams[] = {
    {"HMC_UCX_TLS", "string", "",
     "UCX transports (UCX_TLS syntax, e.g. tcp, shm, ^cma); empty: UCX_TLS or UCX's default"},
    {"HMC_UCX_ADDR", "string", "",
     "IP address of the lifeline listener; empty: the host hint given to listen, or 0.0.0.0"},
    {"HMC_UCX_PORT", "string", "0",
     "TCP port of the lifeline listener: 0 picks an ephemeral port, N that port, LO-HI the first free one of the range"},
    {"HMC_UCX_CMA", "bool", "0",
     "keep cma when no transport has peer failure handling (UCX_TLS=shm): faster same-host puts, "
     "but UCX aborts this process when the peer dies mid-copy"},
    {"HMC_UCX_PUT", "string", "auto",
     "how puts move: rma (ucp_put_nbx; over tcp or into unmapped shared memory it may land in a region "
     "deregistered a moment before), am (active messages the target checks and writes), or auto: rma over "
     "verbs and into shared memory the initiator maps, else am"},
};

inline constexpr unsigned kAmId = 0x4d;  // "M"
inline constexpr size_t kMaxMessage = size_t{1} << 30;
// Advice for peers reached through shared memory (hmc_net_props_t::eager_limit_same_host).
inline constexpr size_t kShmEagerLimit = 32 * 1024;
// Advice for the same peers (hmc_net_props_t::rndv_get_max_same_host): the receiver gets
// rendezvous messages up to this size. On the 2-vCPU Xeon VM, gets against puts: 64-128 KiB
// 10-30 % faster, 256-512 KiB level, 768 KiB-1 MiB 20-50 % slower, larger level or faster
// (docs/performance.md, "Rendezvous by get").
inline constexpr size_t kShmGetLimit = 512 * 1024;
// ... and from this size up again (hmc_net_props_t::rndv_get_from_same_host): puts in
// between keep the sender's buffer and the destination in its cache; from 1.5 MiB gets are
// level or faster (2 MiB: 30 %), on the 2-vCPU and the 16-core Xeon VMs alike.
inline constexpr size_t kShmGetFrom = 1536 * 1024;

enum class Kind : uint32_t { kMsg = 1, kCheck, kReply, kRevoke, kPutData, kPutDone, kMapped, kMappedAck, kRevoked };

// kPutDone's verdict (Wire::arg).
enum PutVerdict : uint64_t { kLanded = 0, kRefused = 1, kLost = 2 };

// The active-message header of everything sent on a connection.
struct Wire {
  uint32_t conn;    // the receiver's connection id
  uint32_t kind;    // Kind
  uint64_t cookie;  // the receiver's cookie (from its handshake)
  uint64_t seq;     // per connection and direction, from 0
  uint64_t token;   // kCheck/kReply/kPutData/kPutDone: put id;
                    // kRevoke/kRevoked/kMapped/kMappedAck: region id
  uint64_t arg;     // kCheck/kPutData: offset; kReply: 0 accepted, else refused;
                    // kPutDone: PutVerdict; kRevoke/kRevoked/kMapped/kMappedAck: nonce
  uint64_t len;     // kCheck: put length; kPutData: region id; kRevoke: 1 answer kRevoked
};

// kMsg goes with the header up to `seq` only (the rest reads 0): with HMC's 40-byte header
// and up to 28 bytes of data it stays within UCX's shared-memory am_short (100 bytes,
// UCP's own 8 included), which copies it inline; the whole Wire sent 8 bytes of data
// through am_bcopy (docs/ucx.md, "Messages").
constexpr size_t kMsgWire = offsetof(Wire, token);

// How puts move (HMC_UCX_PUT; put.cpp).
enum class PutMode { kAuto, kRma, kAm };

struct Conn;
struct Recv;

// A UCP operation in flight; user_data of its callback. Freed by the callback
// (or at once when UCP completed it inline). `conn` is cleared when the
// connection goes away first.
struct Op {
  enum Type { kSend, kControl, kRecvData, kFlush, kGet, kPutSend, kPutRecv } type;
  explicit Op(Type t) : type(t) {}
  class Provider* provider = nullptr;
  Conn* conn = nullptr;
  const char* src = nullptr;  // kSend: the caller's buffer (while held)
  Request* req = nullptr;  // kSend, kFlush, kGet: the host's request
  Recv* recv = nullptr;    // kRecvData
  uint64_t put = 0;        // kFlush, kPutSend, kPutRecv: the put it belongs to
  uint64_t region = 0;     // kPutRecv: the region it lands in
  size_t bytes = 0;
  Wire wire{};
  std::string payload;  // kControl
  // kRecvData without peer failure handling: UCP cannot cancel a rendezvous
  // receive then, so it lands here and is copied out, never into a buffer
  // the caller may have freed after close_conn.
  std::unique_ptr<char[]> bounce;  // `bytes` long when set
};

// UCP request parameters whose send callback hands `op` to its provider's on_op_done and
// frees the request (conn.cpp).
ucp_request_param_t send_param(Op* op);

// A posted receive. Receives are assigned messages in posting order and
// reported complete in that order.
struct Recv {
  Recv(char* b, size_t c, Request* r) : buf(b), cap(c), req(r) {}
  char* buf;
  size_t cap;
  Request* req;
  bool assigned = false;
  bool landed = false;
  int rc = HMC_PROV_OK;
  size_t bytes = 0;
  std::string why;
  Op* op = nullptr;  // a rendezvous receive in flight
};

// A message that arrived with no receive posted (or ahead of its turn).
struct Incoming {
  Wire wire{};
  size_t len = 0;
  bool rndv = false;
  void* held = nullptr;            // UCP's data or rendezvous descriptor, kept past the callback
  const void* transient = nullptr; // UCP's data, valid during the callback only
  std::string copy;                // eager data copied out of the callback
  const char* bytes() const {
    return static_cast<const char*>(held ? held : transient ? transient : copy.data());
  }
};

// A put, or with `dst` a get (which shares the put's checks and bookkeeping).
struct PendingPut {
  uint64_t id;
  Request* req;
  const char* src;
  size_t len;
  uint64_t offset;
  std::string key;  // the packed key, as the host gave it
  char* dst = nullptr;
};

struct VerifiedKey {
  ucp_rkey_h rkey = nullptr;
  uint64_t region = 0, nonce = 0, base = 0;
  bool am = false;  // puts with it go as active messages (put.cpp)
  // The region as mapped here (ucp_rkey_ptr of `base`, HMC_UCX_PUT=auto): puts and gets
  // are a memcpy into or out of it, as UCP's own put over shared memory is. Puts copy only
  // once the target knows (kMapped, kMappedAck): its deregistration then waits for them
  // (memory.cpp, drop_region); until then they go as active messages.
  char* mapped = nullptr;
  bool map_known = false;
};

// A put sent as an active message: done once UCP has sent it and the target
// has said that it landed (or why not).
struct AmPut {
  Request* req = nullptr;
  size_t len = 0;
  bool sent = false, answered = false;
  int rc = HMC_PROV_OK;
  std::string why;
};

// Acceptor side: kHandshake until the connector's handshake is in, kChecking while
// the host checks its hello (nothing the connector sent beyond it is used yet), then
// kHandshake again, with the endpoint, until the connector's byte says it is open.
struct Conn {
  enum State { kHandshake, kChecking, kOpen, kFailed } state = kHandshake;
  // Whether it carries answers to the peer: its endpoint is up and it has not failed. The
  // acceptor has the endpoint (kHandshake) before the connector's byte says it is open,
  // and the connector, open already, may put at once: that put is answered, and its
  // landing counted, like any other.
  bool carries() const { return ep != nullptr && state != kFailed; }
  uint32_t id = 0;
  uint64_t cookie = 0;
  uint32_t peer_id = 0;
  uint64_t peer_cookie = 0;
  bool connector = false;
  bool closing = false;      // close_conn is under way (and may let mu_ go while it waits)
  bool peer_gone = false;    // close_conn found the peer's lifeline ended: nothing lands any more
  void* listener = nullptr;  // acceptor side, until accepted
  int fd = -1;               // the lifeline
  std::string out, in;       // handshake bytes to write / read so far
  std::string peer;          // "ip:port" for messages
  std::vector<char> hello;
  std::vector<char> peer_worker;  // the peer's UCX worker address, until the endpoint exists
  Clock::time_point since = Clock::now();  // acceptor: when the connection came (drop_strangers)
  ucp_ep_h ep = nullptr;
  int error = 0;
  std::string why;
  uint64_t send_seq = 0, recv_seq = 0;
  std::map<uint64_t, Incoming> inbox;   // arrived, not yet handed out (by seq)
  std::deque<Incoming> unexpected;      // in order, waiting for a receive
  std::deque<Recv> recvs;  // by value: a deque keeps references across push_back and pop_front
  size_t assigned = 0;                  // recvs[0, assigned) have a message
  std::deque<Op*> held;                 // sends waiting for earlier puts to finish
  size_t puts = 0;                      // puts and gets not yet complete: later sends wait
  std::map<uint64_t, PendingPut> checking;  // puts waiting for the target's verdict
  std::map<uint64_t, AmPut> am_puts;         // active-message puts under way, by put id
  std::map<std::string, VerifiedKey, std::less<>> keys;  // keys the target accepted (found by view)
  std::set<uint64_t> owe_revoked;  // target: regions whose kRevoked this peer still owes
  std::set<Op*> ops;
  bool pending = false;  // in the provider's pending_ (mark_pending)
};

// Connections a listener brought wait for their handshake and then for the host within
// the limits of common/strangers.h (drop_strangers, make_room).
struct Listener {
  int fd = -1;
  std::string addr;
  std::deque<uint32_t> ready;  // connections whose hello is in, to accept
  // accept4 failed for want of descriptors: out of the epoll set until then (resume_listeners).
  Clock::time_point paused_until{};
};

// The packed remote key: this header, then ucp_rkey_pack's bytes (memory.cpp).
struct KeyHead {
  uint32_t magic;
  uint16_t version;
  uint16_t ucx_len;
  uint64_t region, nonce, base, length;
};
static_assert(sizeof(KeyHead) == 40);
bool parse_key(const void* blob, size_t len, KeyHead& head);

// Memory UCP mapped (ucp_mem_map), with its packed rkey. Unmapped, under the
// provider's lock, when the last region or allocation using it lets go: the
// pages of memory from mem_alloc live until then.
struct Mapping {
  Mapping(ucp_context_h c, ucp_mem_h m) : context(c), mem(m) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ucp_mem_unmap(context, mem); }
  ucp_context_h context;
  ucp_mem_h mem;
  char* base = nullptr;
  size_t len = 0;
  std::string packed;  // ucp_rkey_pack's bytes
};

struct Region {
  uint64_t id = 0, nonce = 0;
  char* base = nullptr;
  size_t len = 0;
  std::shared_ptr<Mapping> mapping;  // null for an empty region
  std::string key;                // the packed key handed out
  std::set<uint32_t> verified;    // connections told this key is good
  std::set<uint32_t> mapped_by;   // ... whose puts copy through a mapping (kMapped)
};

// What the thread's epoll set watches: kind in the top byte, an id below.
enum Watch : uint64_t { kEvent = 0, kUcx = 1, kListen = 2, kSocket = 3 };
inline uint64_t watch_tag(Watch w, uint64_t id) { return (static_cast<uint64_t>(w) << 56) | id; }
uint64_t random64();

class Provider {
 public:
  explicit Provider(const hmc_host_services_t& host);
  Provider(const Provider&) = delete;
  Provider& operator=(const Provider&) = delete;
  ~Provider();

  // Reads parameters and brings UCX up; non-zero with `why` refuses init.
  int start(std::string& why);
  hmc_net::Host& host() { return host_; }
  void props(hmc_net_props_t& p) const;

  int listen(const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len, void** listener);
  int close_listener(void* listener);
  int connect(const void* addr, size_t addr_len, const void* hello, size_t hello_len, void** conn);
  int conn_status(void* conn);
  int accept(void* listener, void** conn, void* hello, size_t hello_cap, size_t* hello_len);
  int close_conn(void* conn);
  int send_msg(void* conn, const void* buf, size_t len, void** req);
  int recv_msg(void* conn, void* buf, size_t cap, void** req);
  int reg_mem(void* ptr, size_t bytes, int mem_kind, void** mr);
  int dereg_mem(void* mr);
  int pack_rkey(void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len);
  int mem_alloc(size_t bytes, void** ptr, void** mr);
  int mem_free(void* ptr, void* mr);
  int put(void* conn, const void* src, size_t len, const void* rkey, size_t rkey_len,
          uint64_t offset, void** req);
  int get(void* conn, void* dst, size_t len, const void* rkey, size_t rkey_len, uint64_t offset,
          void** req);
  int test(void* req, int* done, size_t* bytes, char* message, size_t message_cap) {
    return requests_.test(req, done, bytes, message, message_cap);
  }
  uint64_t events() const { return requests_.ends(); }
  int progress();
  // The ABI's idle (net.h): the host stops polling; the thread takes the worker over now.
  void idle();

  // UCP callbacks (static trampolines in conn.cpp / put.cpp call these under mu_).
  ucs_status_t on_am(const Wire& w, void* data, size_t len, const ucp_am_recv_param_t* param);
  void on_op_done(Op* op, ucs_status_t status, size_t length);
  void on_ep_error(ucp_ep_h ep, ucs_status_t status);
  void lose(Conn& c, ucs_status_t status);
  void refused_close(const Conn& c, ucs_status_t s);
  // Endpoint error callback. UCX 1.13 may run it from another worker's progress
  // (two providers of one process connected over tcp), even after this
  // provider is gone: so it goes through a registry of live providers and a
  // lock of its own.
  static void on_error_callback(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  // provider.cpp: thread, sockets, handshakes, connection life.
  int init_context(const std::string& tls, std::string& why);
  void run();
  void wait_events(std::vector<epoll_event>& events, const timespec& wait,
                   std::vector<std::pair<uint64_t, uint32_t>>& ready);
  void handle_event(uint64_t tag, uint32_t events);
  void handle_listener(Listener& l);
  void handle_socket(Conn& c, uint32_t events);
  bool finish_handshake(Conn& c);
  void vouch(Conn& c);
  void drop_strangers();
  void make_room(Listener& l);
  void resume_listeners();
  void watch(int fd, uint64_t tag, uint32_t events);
  Conn* find(void* conn);
  void fail(Conn& c, int code, const std::string& why);
  void retire(std::unique_ptr<Conn> c);
  // close_conn's work; `force_stuck` (fini): operations UCX still holds at `cap` are forced off.
  void close_locked(std::unique_lock<std::mutex>& lock, Conn* c, Clock::time_point cap, bool force_stuck = false);
  void keep_arrived(Conn& c, bool keep);
  // Worker progress under mu_, until idle or (until_idle false: a host that polls
  // again soon) one productive pass; true if anything moved.
  bool drive(bool until_idle = true);
  void wake_later() { wake_ = true; }
  void mark_pending(Conn& c) {
    if (!std::exchange(c.pending, true)) pending_.push_back(c.id);
  }
  void kick_thread();  // wakes the thread through event_fd_: it looks at once
  // A host call that copied a while just ended (put, with mu_ held): the host counts as
  // polling from now, and the gap to the next progress() counts from now.
  void note_host_call();
  void unlock_and_wake(std::unique_lock<std::mutex>& lock);

  // conn.cpp: messages.
  void send_now(Conn& c, Op* op, const void* buf, size_t len);
  // Sends `buf` now if UCX can finish it at once (a message within UCX's am_short limit, as
  // an 8 B one over shared memory or tcp): then no Op is made. False, with nothing sent,
  // when it cannot.
  bool send_at_once(Conn& c, Request* req, const void* buf, size_t len);
  void send_control(Conn& c, Kind kind, uint64_t token, uint64_t arg, uint64_t len,
                    std::string payload);
  void pump(Conn& c);
  void dispatch(Conn& c, Incoming m);
  void deliver(Conn& c, Incoming m);
  void assign(Conn& c, Recv& r, Incoming& m);
  void complete_ready(Conn& c);
  void* fetch(Incoming& m, Op* op, void* dest);
  void release_held(Conn& c);
  void broken(Conn& c, ucs_status_t status);
  void drop(Incoming& m);

  // memory.cpp: mappings, regions, allocations.
  int map(void* ptr, size_t bytes, std::shared_ptr<Mapping>& out);
  void* add_region(char* base, size_t len, std::shared_ptr<Mapping> mapping);
  void drop_region(std::unique_lock<std::mutex>& lock, uint64_t id);
  // One look of a wait under mu_ (`lock`) that began at `started`: drives the worker, and past
  // the first millisecond lets mu_ go for a moment, so that a peer that answers nothing
  // (stopped, not gone) stalls only the waiting call, not the other connections and the
  // provider's thread. Whether the worker moved.
  bool look(std::unique_lock<std::mutex>& lock, Clock::time_point started);
  std::shared_ptr<Mapping> allocation_of(const char* ptr, size_t bytes) const;

  // put.cpp: checks, puts, revocations.
  void on_check(Conn& c, const Wire& w, const std::string& key);
  void on_reply(Conn& c, const Wire& w, const std::string& why);
  void on_revoke(Conn& c, const Wire& w);
  void on_mapped(Conn& c, const Wire& w);
  void on_mapped_ack(Conn& c, const Wire& w);
  int one_sided(void* conn, PendingPut p, const void* rkey, size_t rkey_len, void** req);
  void start_put(Conn& c, PendingPut p, const VerifiedKey& k);
  void start_get(Conn& c, PendingPut p, const VerifiedKey& k);
  void start_am_put(Conn& c, PendingPut p, const VerifiedKey& k);
  bool am_put_for(const VerifiedKey& k) const;
  char* mapped_for(const VerifiedKey& k) const;
  void on_put_data(Conn& c, Incoming& m);
  void on_put_done(Conn& c, const Wire& w, const std::string& why);
  void am_put_step(Conn& c, uint64_t id, bool sent, int rc, const std::string& why);
  bool landing(uint64_t region) const;
  void put_finished(Conn& c, Request* req, size_t bytes, int rc, const std::string& why);
  void copied(Conn& c, const PendingPut& p);
  void drop_keys(Conn& c);

  hmc_net::Host host_;
  std::mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<char> worker_addr_;
  std::string transports_;  // what UCX selected, e.g. "tcp,posix,cma"
  bool peer_errors_ = true;  // endpoints in UCP_ERR_HANDLING_MODE_PEER (else NONE)
  PutMode put_mode_ = PutMode::kAuto;
  bool tcp_only_ = false;  // UCX has tcp and no verbs transport (auto puts: put.cpp)
  bool rdma_ = false;      // UCX has a verbs transport (rc, ud, dc)
  double latency_us_ = 0, bandwidth_gbps_ = 0;
  size_t eager_limit_same_host_ = 0;  // props advice; 0 = none
  uint64_t caps_absent_ = 0;          // props: table caps this configuration lacks
  std::string bind_addr_;
  hmc_net::PortRange ports_;  // HMC_UCX_PORT
  int epoll_ = -1, event_fd_ = -1, ucx_fd_ = -1;
  bool fine_waits_ = true;  // epoll_pwait2 works; else epoll_wait (wait_events)
  std::thread thread_;
  bool stop_ = false;
  std::atomic<Clock::rep> host_polled_{0};  // when progress() last ran as part of a poll loop
  std::atomic<int> host_inside_{0};          // host calls copying under mu_ right now (put)
  Clock::duration last_progress_{};  // when progress() last ran at all (under mu_)
  bool moved_last_ = false;          // that call's pass moved something (under mu_)
  std::atomic<bool> idle_{false};    // idle() came: the next progress() is not a poll
  // The thread has the worker's fd in its epoll set (start() puts it there); only the
  // thread changes it, progress() reads it.
  std::atomic<bool> thread_watches_{true};
  bool wake_ = false;
  hmc_net::RequestTable requests_;
  uint32_t next_conn_ = 1;
  Clock::time_point swept_{};  // drop_strangers' last look
  std::size_t max_waiting_ = 0;   // common/strangers.h, read at the first accept
  std::size_t crowded_out_ = 0;   // closed by make_room since drop_strangers last said so
  Clock::time_point flush_stalled_at_{};  // when close_conn last gave a flush up (kFlushStall)
  uint64_t next_region_ = 1, next_put_ = 1;
  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<void*, std::unique_ptr<Listener>> listeners_;
  std::unordered_map<uint64_t, std::unique_ptr<Region>> regions_;  // by id
  std::map<uintptr_t, std::shared_ptr<Mapping>> allocations_;  // mem_alloc's, by base address
  std::vector<void*> closing_;  // ep closes in flight
  // Mode NONE (shared-memory transports only): one endpoint per peer worker, shared by
  // every connection to it and kept until ucp_worker_destroy. UCX 1.13 frees such an
  // endpoint only there (it refuses a forced close and keeps one closed by flush), and each
  // maps the peer's segments anew: an endpoint per connection left 2-3 mappings and up to
  // 180 KB resident per communicator ever made. Messages name their connection, so
  // connections can share one.
  std::map<std::vector<char>, ucp_ep_h> shared_eps_;
  // Ops of closed connections that UCX still holds (a rendezvous receive whose sender died
  // is never handed back): freed by their late callback, or after ucp_worker_destroy.
  std::set<Op*> orphans_;
  std::vector<ucp_rkey_h> dead_rkeys_;  // destroyed once no put can use them
  // Connections with inbox or held work after a callback (mark_pending), each once: a
  // vector that keeps its storage, not a set that allocates a node per message.
  std::vector<uint32_t> pending_, pending_scan_;
  std::vector<std::pair<uint32_t, ucs_status_t>> broken_;  // connections to fail in drive() (broken())
  std::mutex errors_mu_;  // taken alone, never while calling UCP
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> errors_;  // endpoint failures to handle
  std::atomic<bool> errors_pending_{false};  // errors_ may be non-empty (set under errors_mu_)
};

}  // namespace hmc_ucx
