// One framed, bidirectional connection over a stream socket (TCP or Unix).
//
// Threads. The socket and the reader/writer state belong to the provider's io
// thread. Caller threads queue work under mu_ (send queue, posted receives,
// buffered messages, state) and poke the io thread. Requests are completed on
// the io thread and the host is woken once per read or write turn.
//
// One exception, for latency: a send_msg of a small message that finds the
// writer idle (nothing queued, no pump armed, no other caller writing) claims
// the write side under mu_ (caller_writing_) and writes the frame itself with
// one non-blocking sendmsg; whatever the socket did not take goes to the front
// of the queue for the io thread. Not in a stream of sends (more than two
// back to back, none received in between): those are left to the io thread,
// which batches them. While a caller holds the write side the io thread
// writes nothing (kick_locked and queue_ctrl defer to the caller, who arms the
// pump when it lets go), and close() waits for it before closing the socket.
// Such a request completes before send_msg returns (no wake needed).
// Likewise a direct put that finds nothing queued runs on its caller's thread
// (caller_putting_; kCallerPutMax in connection.cpp), and the queue waits
// behind it.
//
// Writes are FIFO: frames leave in the order send_msg/put were called, as one
// scatter/gather write of headers and user buffers (user data is never copied).
// A direct put (shm single copy) waits at the head of the queue until the
// frames before it are written, runs on the io thread, and only then lets the
// frames behind it go: a message sent after a put arrives after the data.
// Control frames (ack/nak) may overtake queued data; they carry no user data. None
// overtakes the rest of a frame that a caller wrote in part (write_batch).
//
// Reads go through a small staging buffer for headers and small payloads;
// large payloads are received straight into the posted receive buffer or the
// registered region. Puts into a region are bounds- and key-checked here, on
// the target, whatever the sender checked.
//
// Message rings (msg_ring.h; transports whose StreamProvider::uses_rings, shm).
// Each side offers its incoming ring as its first frame (after the hello) and
// holds its messages until the peer's offer arrives; then it writes them all
// into the peer's ring, or all through the socket when it cannot map it. So
// one direction never mixes the two, and a receiver reads both. A message
// finds its way into the ring from the caller of send_msg when nothing is
// queued ahead of it (no thread hop), else from the io thread in queue order,
// so direct puts keep the ordering contract. The ring is read by poll_ring,
// from the provider's progress (caller threads, under rx_mu_) and from the io
// thread when a bell frame says the caller threads stopped polling.
// Lock order: rx_mu_ -> mu_.
#pragma once

#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/msg_ring.h"
#include "common/request.h"
#include "common/rkey.h"

namespace hmc_net {

class StreamProvider;

// A put the provider performs itself (shm: process_vm_writev), in queue order.
struct DirectPut {
  const char* src = nullptr;
  uint64_t len = 0;
  uint64_t offset = 0;
  Rkey rkey{};
  uint64_t done = 0;  // bytes written so far
};

// Return values of StreamProvider::direct_put besides 0 and HMC_PROV_ERR_*.
inline constexpr int kDirectMore = 2;       // progressed; call again
inline constexpr int kDirectUseStream = 3;  // cannot write directly; send through the socket

// Per-connection state of a transport (shm: its cache of peer mappings). Used
// and freed on the io thread; close() drops it.
struct TransportState {
  virtual ~TransportState() = default;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;
  using Endpoint = boost::asio::generic::stream_protocol::endpoint;
  // Called on the io thread once an accepted connection's hello arrived (ok)
  // or the connection died before that (!ok).
  using HelloHandler = std::function<void(const std::shared_ptr<Connection>&, bool ok)>;

  Connection(StreamProvider& owner, Socket socket, std::string peer);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Setup. queue_hello before start_connect, from the creating thread.
  void queue_hello(const void* hello, size_t len);
  void start_connect(const Endpoint& endpoint);  // io thread
  void start_accepted(HelloHandler on_hello);    // io thread
  // An accepted connection reads nothing after its hello until the host took it (accept):
  // a stranger cannot make this process buffer what it sends before the host checked it.
  // taken() makes its ring (a stranger costs no ring); resume_reading then offers it.
  void taken();                                   // the host's thread, before others see it
  void resume_reading();                          // io thread

  // Caller threads. Each returns 0 when queued, else the error (no request kept).
  int status() const { return state_.load(std::memory_order_acquire); }
  int send_msg(const void* buf, size_t len, Request* req);
  int recv_msg(void* buf, size_t cap, Request* req);
  int put(const void* src, size_t len, const Rkey& rkey, uint64_t offset, bool direct,
          Request* req);
  const std::vector<char>& hello() const { return hello_; }

  // Any thread: reads what the peer wrote into this side's message ring, stamping
  // the ring as polled when `stamp_ns` is not 0. True when a request completed.
  // Callers' progress passes skip a ring another thread reads (`wait` false); the io
  // thread waits for it (`wait` true): a reader may be about to let go just after it
  // found the ring empty, and the peer's last message, or the one a bell is for,
  // would then be left unread.
  bool poll_ring(int64_t stamp_ns, bool wait = false);
  // Any thread: marks this side's ring as no longer polled (the peer's writes ring a bell).
  void ring_idle() {
    if (rx_ring_) rx_ring_->stamp_polling(0);
  }
  bool has_ring() const { return rx_ring_ != nullptr && rx_ring_->carries_messages(); }

  // Direct puts (shm). The peer's ring, whose put_region marks this side's put steps
  // (msg_ring.h); nullptr when there is none. Set before tx_mode_ leaves pending, and
  // no direct put runs before that, so a put step may read it without the lock.
  SharedRing* put_ring() const { return tx_ring_.get(); }
  // This side's ring, whose put_region shows the peer's put step (kept past close).
  const std::shared_ptr<SharedRing>& rx_ring() const { return rx_ring_; }

  // io thread: fail everything pending with `code` and close the socket.
  void close(int code, const std::string& why);

  // The peer closed its end of the socket (or the socket failed), whether or not bytes it
  // sent before are still unread here. Any thread where the socket cannot be closed
  // meanwhile: the io thread, or a caller inside a direct put (close() waits for it).
  bool peer_hung_up();

  // Peer details, set by the provider's on_open hook (io thread).
  Socket& socket() { return socket_; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  int peer_pid() const { return peer_pid_.load(std::memory_order_relaxed); }
  void set_peer_pid(int pid) { peer_pid_.store(pid, std::memory_order_relaxed); }
  bool direct_ok() const { return direct_ok_.load(std::memory_order_relaxed); }
  void disable_direct() { direct_ok_.store(false, std::memory_order_relaxed); }
  // io thread: the transport's state for this connection (nullptr until set).
  TransportState* transport_state() { return transport_.get(); }
  void set_transport_state(std::unique_ptr<TransportState> t) { transport_ = std::move(t); }

 private:
  struct OutItem {
    FrameHeader hdr{};
    const char* data = nullptr;
    uint64_t skip = 0;              // bytes of header + payload a caller already wrote
    std::unique_ptr<char[]> owned;  // hello and nak text are copied
    Request* req = nullptr;
    std::unique_ptr<DirectPut> direct;
    uint64_t ring_done = 0;  // payload bytes already in the peer's ring
    bool ring_started = false;
  };
  struct PostedRecv {
    char* buf;
    size_t cap;
    Request* req;
  };
  struct Message {
    std::unique_ptr<char[]> data;
    size_t len = 0;
  };
  struct AwaitAck {
    Request* req;
    uint64_t len;
    uint64_t seq;
  };
  static constexpr size_t kStageSize = 64 * 1024;  // headers and small payloads
  enum class Sink : uint8_t { none, hello, recv, unexpected, put, refused_put, nak_text, discard, offer };
  // Where this side's messages go: held until the peer's ring offer arrived, then
  // the socket or the peer's ring for good.
  enum class TxMode : uint8_t { pending, socket, ring };
  // The message being read out of the ring (under rx_mu_).
  struct RingIn {
    bool active = false;
    bool discard = false;  // the posted buffer was too small: drop the payload
    Request* req = nullptr;
    char* dest = nullptr;
    uint64_t total = 0;
    uint64_t got = 0;
    Message msg;  // unexpected: buffered here until a receive is posted
  };
  // The frame being received.
  struct Incoming {
    FrameHeader hdr{};
    Sink sink = Sink::none;  // none: expecting a header
    char* dest = nullptr;
    uint64_t total = 0;
    uint64_t got = 0;
    Request* recv = nullptr;
    Message msg;
    std::string why;
  };

  bool closed() const { return closed_; }
  void kick_locked();
  static OutItem stream_put(const char* src, uint64_t len, const Rkey& rkey, uint64_t offset,
                            Request* req);
  void caller_put(std::unique_lock<std::mutex>& lock, DirectPut& put, Request* req);
  bool caller_write(std::unique_lock<std::mutex>& lock, OutItem& item);
  bool send_now(OutItem& item);
  void queue_offer();
  void on_offer();
  bool is_msg(const OutItem& item) const;
  bool ring_write_locked(OutItem& item);
  bool fill_ring_locked();
  void ring_bell(std::unique_lock<std::mutex>& lock);
  bool ring_take(const RingRecord& rec, bool& delivered, std::string& why);
  bool ring_finish();
  void fail_ring_in(int code, const std::string& why);
  // The oldest posted receive, for a message of `len` bytes (req nullptr: none
  // posted). One too small is failed here, with `truncated` set.
  PostedRecv match_posted(uint64_t len, bool& truncated);
  void fail_truncated(const PostedRecv& r, uint64_t len);
  void deliver(const PostedRecv& r, Message& m);  // completes r; no wake
  // A message that arrived with no receive posted: into the one posted meanwhile
  // (true: a request completed) or kept as unexpected.
  bool settle(Message& m);
  void flush_wake();                              // io thread: wakes the host if due
  void lost(const boost::system::error_code& ec);
  bool protocol_error(const std::string& what);

  // Reader (connection_read.cpp).
  void start_reading();
  void wait_readable();
  void read_loop();
  // Reads and handles what the socket holds; `to_end`: until the kernel has nothing more
  // (or the end, or an error, which it leaves to the caller), without yielding.
  void read_turn(bool to_end = false);
  // The write side failed: reads what the peer sent before (read_turn to the end).
  void read_rest();
  bool drain_stage();
  bool on_header();
  void begin_payload(Sink sink, char* dest, uint64_t total);
  bool take(const char* p, size_t n);
  bool read_direct(boost::system::error_code& ec);
  void refuse_put(const std::string& why);
  bool finish_payload();

  // Writer (connection_write.cpp).
  void pump();
  void pump_turn();
  bool run_direct(size_t& budget);
  void write_batch();
  void write_more();
  void on_written(const boost::system::error_code& ec);
  void queue_ctrl(FrameHeader h, std::string text = {});

  StreamProvider& owner_;
  Socket socket_;
  const int fd_;  // socket_'s descriptor, for caller-thread writes
  std::string peer_;
  std::atomic<int> peer_pid_{0};
  std::atomic<bool> direct_ok_{true};
  std::atomic<int> state_{HMC_PROV_IN_PROGRESS};  // 1 connecting, 0 open, <0 failed

  // Shared with caller threads.
  std::mutex mu_;
  std::string why_;  // why the connection failed
  std::deque<OutItem> send_q_;
  std::deque<PostedRecv> posted_;
  std::deque<Message> unexpected_;
  // The write side's owner. pump_armed_: the io thread (a pump is posted, a
  // write or direct put is under way, or a write will pump when done).
  // caller_writing_: a caller thread in send_now. Never both.
  bool pump_armed_ = false;
  bool caller_writing_ = false;
  bool ctrl_waiting_ = false;   // the io thread queued ack/nak while a caller wrote
  unsigned caller_streak_ = 0;  // caller writes since a message arrived or a pause
  std::chrono::steady_clock::time_point last_send_{};
  bool close_waiting_ = false;  // close() waits on writer_done_ for the caller
  std::condition_variable writer_done_;
  TxMode tx_mode_;
  std::unique_ptr<SharedRing> tx_ring_;  // the peer's ring, written under mu_
  bool direct_busy_ = false;             // the io thread runs a direct put
  bool caller_putting_ = false;          // a caller runs one (close() waits for it)
  bool bell_due_ = false;                // the io thread owes the peer a bell

  // This side's ring and the reader's state. The ring is made by queue_hello (connector)
  // or taken (acceptor), before any other thread sees the connection.
  void make_ring();
  std::shared_ptr<SharedRing> rx_ring_;
  std::mutex rx_mu_;
  RingIn ring_in_;
  bool rx_closed_ = false;
  RingOffer offer_in_{};  // io thread: the peer's offer being received

  // io thread only.
  bool closed_ = false;
  bool awaiting_hello_ = false;
  bool held_ = false;  // hello read, the host has not accepted yet: no more reads
  HelloHandler on_hello_;
  std::vector<char> hello_;
  std::unique_ptr<char[]> stage_;
  size_t stage_begin_ = 0;
  size_t stage_end_ = 0;
  Incoming in_;
  std::deque<OutItem> ctrl_q_;
  std::vector<OutItem> batch_;
  std::vector<boost::asio::const_buffer> bufs_;
  bool writing_ = false;
  size_t write_index_ = 0;           // first buffer of bufs_ not fully sent
  size_t write_offset_ = 0;          // bytes of it already sent
  std::unique_ptr<OutItem> direct_;  // the direct put being executed
  std::deque<AwaitAck> await_ack_;
  uint64_t next_seq_ = 1;
  bool wake_due_ = false;  // a request completed this turn: wake the host once
  std::unique_ptr<TransportState> transport_;
};

}  // namespace hmc_net
