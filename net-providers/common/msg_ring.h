// A message ring in shared memory: one direction of a connection between two
// processes of one host (shm), beside its socket.
//
// The receiving side creates the ring (a memfd, SharedRing::create) and offers
// it to the peer as the first frame on the socket (frame.h, FrameType::ring);
// the peer maps it (SharedRing::map) and from then on writes every message
// into it instead of the socket. Positions are byte counts that only grow; a
// record is a RingRecord and `len` payload bytes, 16-byte aligned, wrapping
// around the end of the data area. A message larger than the free space goes
// as several records, the first flagged kRingFirst and carrying the total.
//
// Waking. The receiver's caller threads read the ring from the provider's
// `progress` (no thread hop), and while they poll often they stamp `poll_ns`
// (stamp_polling). A writer that finds the stamp stale (the receiver sleeps or
// does other work; see core/progress.h for how a waiter that was polling
// sleeps) rings a bell through the socket, whose reader reads the ring on
// the io thread and wakes the host. A writer that finds the ring full sets
// `want_space`; the reader that frees space then rings a bell the other way.
//
// Puts. A ring also carries `put_region`: the writer's direct put (shm) stores
// 1 + the region it is writing into before it checks the region's descriptor,
// and 0 when the step is done; the reader's deregistration clears the region's
// key, then waits for that word to leave the region (stream_provider.cpp,
// dereg_mem). Each side fences between its store and its load, so either the
// put sees the cleared key or the deregistration sees the put. When the reader
// closes the connection it sets `puts_shut`, which the writer checks the same
// way before a step: no put begins after that. A ring made with `messages`
// false carries only these words: the writer's messages keep to the socket
// (HMC_SHM_RING=0).
//
// The ring's memory is as trusted as the socket: every length read from it is
// checked before use (RingReader::next), and a bad one closes the connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hmc_net {

inline constexpr uint32_t kRingFirst = 1;  // first record of a message

struct RingRecord {
  uint32_t len;    // payload bytes in this record
  uint32_t flags;  // kRingFirst
  uint64_t total;  // first record: the message's length
};
static_assert(sizeof(RingRecord) == 16);

// The payload of FrameType::ring: where the offering process keeps its ring.
struct RingOffer {
  int64_t fd = -1;          // the memfd in the offerer's fd table; -1: no ring
  uint64_t bytes = 0;       // size of the mapping
  uint64_t probe_addr = 0;  // where the nonce is in the offerer's address space (shm reads it there)
  // The ring's own random number (RingControl::nonce): the fd may be another ring's by
  // the time the peer opens it, when the offerer closed this connection meanwhile.
  uint64_t nonce = 0;
};

// The control block at the start of the mapping.
struct RingControl {
  uint32_t magic;
  uint32_t version;
  uint64_t capacity;  // bytes of the data area, a power of two
  uint32_t messages;  // 1: the writer sends its messages here; 0: the ring is for put_region only
  uint64_t nonce;     // random, set at creation: which ring this is (RingOffer)
  alignas(64) std::atomic<uint64_t> tail;       // writer: bytes written
  alignas(64) std::atomic<uint64_t> head;       // reader: bytes consumed
  alignas(64) std::atomic<int64_t> poll_ns;     // reader: last stamp while polling
  alignas(64) std::atomic<uint32_t> want_space;  // writer: waits for the head to move
  alignas(64) std::atomic<uint64_t> put_region;  // writer: 1 + region of its put step, or 0
  std::atomic<uint32_t> puts_shut;               // reader: closed, no put step may begin
};

// One ring mapped in this process (either end). Move-only; unmaps when destroyed.
class SharedRing {
 public:
  // A fresh ring of `capacity` data bytes (rounded up to a power of two) in a memfd;
  // `messages` false: for put_region only.
  static std::unique_ptr<SharedRing> create(size_t capacity, bool messages, std::string& why);
  // Maps the ring behind `path` (shm: /proc/<pid>/fd/<fd>) that a peer offered: the
  // offer's size and nonce must match.
  static std::unique_ptr<SharedRing> map(const std::string& path, const RingOffer& offer, std::string& why);
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;
  ~SharedRing();

  RingOffer offer() const;
  RingControl& control() const { return *ctl_; }
  // Whether the writer sends messages through this ring (read once, by map).
  bool carries_messages() const { return messages_; }

  // Writer (one step at a time): a direct put step into `region` begins, ordered
  // before the descriptor check that follows; false (nothing marked) when the
  // reader has shut puts.
  bool put_begin(uint64_t region) {
    ctl_->put_region.store(region + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ctl_->puts_shut.load(std::memory_order_relaxed) == 0) return true;
    put_end();
    return false;
  }
  // Writer: the step's bytes are in place.
  void put_end() { ctl_->put_region.store(0, std::memory_order_release); }
  // Reader: 1 + the region the writer's put step is writing into, or 0.
  uint64_t put_region() const { return ctl_->put_region.load(std::memory_order_acquire); }
  // Reader, closing: no put step begins from now on; true when one is under way.
  bool shut_puts() {
    ctl_->puts_shut.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return ctl_->put_region.load(std::memory_order_relaxed) != 0;
  }

  // Writer. Appends one record with as much of msg[done, total) as fits and
  // advances `done`; false when the ring is too full for a worthwhile record.
  bool write(const char* msg, uint64_t total, uint64_t& done);
  // Writer, after a write that did not take everything: asks the reader for a bell
  // when it frees space. True when space appeared meanwhile (write again).
  bool ask_space();
  // Writer, after writes: whether the reader has stopped polling (ring a bell).
  bool reader_idle(int64_t now_ns) const;

  // Reader: stamps the ring as polled now.
  void stamp_polling(int64_t now_ns) { ctl_->poll_ns.store(now_ns, std::memory_order_relaxed); }

  // Reader. next() looks at the record at the head: false when none, or with `why`
  // set when the ring holds garbage. copy() reads payload bytes of that record;
  // consume() frees it and returns whether the writer asked for a bell.
  bool next(RingRecord& rec, std::string& why);
  void copy(uint64_t from, char* dst, uint64_t n) const;
  bool consume(const RingRecord& rec);

  // Largest payload one record can carry.
  uint64_t max_record() const { return cap_ - sizeof(RingRecord); }

  static int64_t now_ns();
  // A reader whose stamp is older than this is idle: long enough for a poll loop
  // that yields its core on a busy host. core/progress.cpp's kQuietTime (how long a
  // waiter that was polling sleeps before it polls again) must be longer.
  static constexpr int64_t kIdleNs = 100'000;

 private:
  SharedRing(int fd, void* base, size_t bytes);
  void copy_in(uint64_t pos, const void* src, uint64_t n);

  int fd_;
  void* base_;
  size_t bytes_;
  RingControl* ctl_;
  char* data_;
  uint64_t cap_ = 0;
  bool messages_ = true;
  uint64_t pos_ = 0;  // this end's own index (writer: tail, reader: head), kept locally
};

}  // namespace hmc_net
