#include "collectives/shm_coll.h"

#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "collectives/comm_state.h"
#include "collectives/driver.h"
#include "collectives/driver_op.h"
#include "collectives/scratch.h"
#include "collectives/select.h"
#include "core/comm_impl.h"

namespace hmc::coll {
namespace {

// A rank's segment (core/host_segments.h): the last sequence number it finished, then two
// slots, each with the sequence number whose input it holds, the one whose reduced share it
// holds (all_reduce, reduce), and the data.
using core::HostSegments;
constexpr std::size_t kDoneOff = 0;
constexpr std::size_t done_off(uint64_t) { return kDoneOff; }  // one word for both slots
constexpr std::size_t seq_off(uint64_t b) { return HostSegments::slot_off(b); }
constexpr std::size_t red_off(uint64_t b) { return HostSegments::slot_off(b) + 64; }
constexpr std::size_t data_off(uint64_t b) { return HostSegments::slot_off(b) + HostSegments::kSlotHeader; }
static_assert(data_off(1) + kSlotBytes <= HostSegments::kBytes);
// A one-round collective whose slot holds at most this much keeps it in the line of the
// slot's sequence number instead: a reader then pulls one line from each rank, not two.
constexpr std::size_t kInlineBytes = 56;
static_assert(8 + kInlineBytes <= 64);

// An all_reduce round is reduced whole by every rank (one wait) while each rank reads at
// most this many bytes of the others' inputs so; beyond, each rank reduces a share, then
// the shares are gathered (two waits, each input read once). From hmc-bench all_reduce
// at 16-64 KiB on 2 and 4 ranks (docs/performance.md).
constexpr std::size_t kWholeReduceMax = 32 << 10;

// A 2-rank all_gather of kCmaMin or more per rank (all_to_all: per block) skips the
// slots: each rank reads the other's input straight from its memory with process_vm_readv,
// in one round, one copy instead of two, and completes once the other is done reading its
// own. hmc-bench all_gather, 2 ranks, medians of 5: 64 KiB 6.7 against 8.4 us, 256 KiB 17
// against 24; 32 KiB favours the slots (3.0 against 4.9), as do 4 ranks on 2 cores at
// every size (128 KiB: 44 against 23). From 512 KiB the slots depend on how fast the two
// cores pass freshly written lines, which on the development VM drops 5-8x for minutes at
// a time (all_gather of 2 MiB: 80-100 us, then 620-680), while the direct read held 68-86
// (docs/performance.md).
constexpr std::size_t kCmaMin = 32 << 10;

// A slot's sequence number carries the low 16 bits of its call's number (which every rank's
// call takes, refused by its own checks or not) above the round's: ranks whose rounds fell
// out of line, where a call was refused on one rank and ran on the others, see it and fail
// rather than read another call's input.
constexpr int kCallShift = 48;
constexpr uint64_t kRoundMask = (uint64_t{1} << kCallShift) - 1;

std::atomic_ref<uint64_t> word(uint8_t* seg, std::size_t off) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(seg + off));
}

// Collectives whose input is one block per rank (block r goes to rank r).
bool per_rank_blocks(CollKind k) { return k == CollKind::kAllToAll || k == CollKind::kReduceScatter; }

// How a collective is cut into rounds of at most one slot per rank: `chunk` bytes of each
// rank's input (all_gather), of the buffer (all_reduce, broadcast) or of each block
// (all_to_all, reduce_scatter), whole elements where they are reduced.
struct Rounds {
  std::size_t total = 0;  // bytes to cover: the input, or one block
  std::size_t chunk = 0;
  uint64_t count = 0;
  bool cma = false;  // one round, read from the other rank's buffers (kCmaMin)
};

Rounds rounds_of(const CclWork& w, int n, bool cma) {
  Rounds r;
  const std::size_t part = w.kind == CollKind::kAllToAll ? w.send_bytes / 2 : w.send_bytes;
  if (cma && n == 2 && (w.kind == CollKind::kAllGather || w.kind == CollKind::kAllToAll) && part >= kCmaMin) {
    r.total = r.chunk = part;
    r.count = 1;
    r.cma = true;
    return r;
  }
  if (w.kind == CollKind::kBarrier) {
    r.count = 1;  // a round with no data
    return r;
  }
  const std::size_t elem = dtype_size(w.dtype);
  if (per_rank_blocks(w.kind)) {
    r.total = w.send_bytes / n;
    r.chunk = kSlotBytes / n;
    r.chunk = r.chunk > 64 ? r.chunk & ~std::size_t{63} : r.chunk / elem * elem;
  } else {
    r.total = w.send_bytes;
    r.chunk = kSlotBytes / elem * elem;
  }
  r.count = r.chunk ? (r.total + r.chunk - 1) / r.chunk : 0;
  return r;
}

class ShmColl final : public DriverOp {
 public:
  ShmColl(core::CommImpl& comm, std::shared_ptr<core::HostSegments> segs, std::shared_ptr<ShmSeq> state,
          const CclWork& w, Rounds rounds, uint64_t first_seq, uint64_t call, std::shared_ptr<ScratchPool> pool)
      : ctx_(comm.context()), comm_(&comm), segs_(std::move(segs)), state_(std::move(state)), w_(w), rounds_(rounds),
        first_(first_seq), call_((call & 0xffff) << kCallShift), result_(core::Operation::make(comm.context().engine())),
        inline_(rounds.count == 1 && !rounds.cma &&
                (per_rank_blocks(w.kind) ? rounds.total * segs_->size() : rounds.total) <= kInlineBytes),
        pool_(std::move(pool)) {
    result_->engine()->segment_waits(+1, segs_);
    result_->what = {coll_kind_name(w.kind), -1, 0, w.result_bytes};
  }
  ~ShmColl() override { end_wait(); }

  const std::shared_ptr<core::Operation>& result() const { return result_; }
  void start() override { advance(); }
  bool finished() const override { return finished_; }
  // Calls publish in the order of their sequence numbers: one that could not publish its
  // first round holds every later one back (publish() waits for the same slot's last user).
  const void* line() const override { return state_.get(); }
  bool waiting_in_line() const override { return !finished_ && published_ == 0; }
  // abort() and the communicator's end drop it (Driver::drop, under the driver's lock, so
  // no pass is copying then): its rounds read and write the caller's buffers.
  bool uses(const void* comm) const override { return comm == comm_; }
  void drop(Status why) override { fail(why); }
  void abandon(Status why) override {
    fail(why);
    // The context, whose cpu provider would release the mappings, is going away: keep them.
    static std::mutex mu;
    static auto* graveyard = new std::vector<std::shared_ptr<core::HostSegments>>();
    std::lock_guard lock(mu);
    graveyard->push_back(std::move(segs_));
  }

  // As far as the other ranks allow: the next round's input goes in while this one is read.
  bool advance() override {
    bool moved = false;
    while (!finished_) {
      if (check_failed(false)) return true;  // finalized: not one more round into the buffers
      if (draining_) {  // the others may still be reading this rank's buffers
        if (!everyone_at(done_off, seq(rounds_.count - 1))) break;
        finish();
        return true;
      }
      bool step = false;
      if (published_ < rounds_.count && published_ <= current_ + 1 && publish(published_)) {
        ++published_;
        step = true;
      }
      if (current_ < published_) {
        if (Status s = run_round(step); !s.ok()) {
          fail(s);
          return true;
        }
      }
      if (!step) break;
      moved = true;
    }
    if (finished_) return moved;
    return check_failed(true) || moved;
  }

 private:
  uint64_t seq(uint64_t round) const { return first_ + round; }
  static uint64_t slot(uint64_t seq) { return seq & 1; }
  std::size_t offset(uint64_t round) const { return round * rounds_.chunk; }
  std::size_t length(uint64_t round) const { return std::min(rounds_.chunk, rounds_.total - offset(round)); }
  uint8_t* own() const { return segs_->of(segs_->rank()); }
  std::size_t payload_off(uint64_t s) const { return inline_ ? seq_off(slot(s)) + 8 : data_off(slot(s)); }
  const uint8_t* data(int r, uint64_t s) const { return segs_->of(r) + payload_off(s); }

  // Round `round`'s input into this rank's slot, once every rank finished reading what that
  // slot held (two rounds ago). all_gather and all_to_all copy this rank's own block of the
  // result then too, while the others read, rather than through the slot.
  bool publish(uint64_t round) {
    const uint64_t s = seq(round);
    const int me = segs_->rank();
    if (s > 2 && !everyone_at(done_off, s - 2)) return false;
    uint8_t* dst = own() + payload_off(s);
    const auto* src = static_cast<const uint8_t*>(w_.send);
    const std::size_t off = offset(round), len = length(round);
    if (rounds_.cma) {  // where to read it from
      word(own(), seq_off(slot(s)) + 8).store(reinterpret_cast<uintptr_t>(src), std::memory_order_relaxed);
    } else if (per_rank_blocks(w_.kind)) {
      // reduce_scatter reads its own block from the slot too: in place, the result
      // overwrites it while the reduction still needs it.
      for (int p = 0; p < segs_->size(); ++p)
        if (p != me || w_.kind == CollKind::kReduceScatter) std::memcpy(dst + p * len, src + p * rounds_.total + off, len);
    } else if (len && (w_.kind != CollKind::kBroadcast || me == w_.root)) {
      std::memcpy(dst, src + off, len);
    }
    word(own(), seq_off(slot(s))).store(s | call_, std::memory_order_release);
    segs_->ring_peers();
    if (w_.kind == CollKind::kAllGather || w_.kind == CollKind::kAllToAll) {
      const std::size_t from = w_.kind == CollKind::kAllToAll ? me * rounds_.total : 0;
      uint8_t* to = static_cast<uint8_t*>(w_.recv) + me * rounds_.total + off;
      if (to != src + from + off) std::memcpy(to, src + from + off, len);  // in place: already there
    }
    return true;
  }

  // Whether every rank's input of round s is up (kUp), not yet (kNotYet), or a rank's
  // slot holds another call's round (its number; a rank's slot cannot get past round s
  // before this rank is done with it).
  static constexpr int kUp = -1, kNotYet = -2;
  int inputs_up(uint64_t s) const {
    for (int r = 0; r < segs_->size(); ++r) {
      const uint64_t at = word(segs_->of(r), seq_off(slot(s))).load(std::memory_order_acquire);
      if (at == (s | call_)) continue;
      return (at & kRoundMask) < s ? kNotYet : r;
    }
    return kUp;
  }

  // Rank r's word at off(slot of s) has reached s.
  bool reached(int r, std::size_t (*off)(uint64_t), uint64_t s) const {
    return word(segs_->of(r), off(slot(s))).load(std::memory_order_acquire) >= s;
  }
  bool everyone_at(std::size_t (*off)(uint64_t), uint64_t s) const {
    for (int r = 0; r < segs_->size(); ++r)
      if (!reached(r, off, s)) return false;
    return true;
  }

  void finish() {
    // An in-place all_to_all read the other's block aside: its place here was the block
    // the other was reading.
    if (rounds_.cma && w_.kind == CollKind::kAllToAll && w_.send == w_.recv)
      std::memcpy(static_cast<uint8_t*>(w_.recv) + (1 - segs_->rank()) * rounds_.total, aside_, rounds_.total);
    finished_ = true;
    end_wait();
    result_->complete(w_.result_bytes);
  }

  // `len` bytes at `at` in rank r's input of round s, read from its memory (cross-memory
  // attach). One call moves at most 2 GiB - 4 KiB (Linux's MAX_RW_COUNT): larger blocks
  // take several.
  Status read_from(int r, uint64_t s, std::size_t at, uint8_t* to, std::size_t len) {
    const uint64_t from = word(segs_->of(r), seq_off(slot(s)) + 8).load(std::memory_order_relaxed) + at;
    for (std::size_t done = 0; done < len;) {
      iovec local{to + done, len - done}, remote{reinterpret_cast<void*>(from + done), len - done};
      const ssize_t got = process_vm_readv(segs_->pid(r), &local, 1, &remote, 1, 0);
      // The process gone (before core has marked it lost): the loss is the reason.
      if (got < 0 && errno == ESRCH)
        return {ErrorCode::kPeerLost, "rank " + std::to_string(r) + " (pid " + std::to_string(segs_->pid(r)) +
                                          ") is gone: its memory cannot be read"};
      if (got <= 0)
        return {ErrorCode::kInternal, "cross-memory read of " + std::to_string(len) + " bytes from rank " +
                                          std::to_string(r) + " stopped after " + std::to_string(done) + ": " +
                                          (got < 0 ? std::strerror(errno) : "nothing read")};
      done += static_cast<std::size_t>(got);
    }
    return {};
  }

  // One step of the current round, if the other ranks are there; `moved` says so.
  Status run_round(bool& moved) {
    const uint64_t s = seq(current_);
    if (!reduced_) {
      // This rank finished the collective before this one, and every rank's input is up.
      if (state_->finished.load(std::memory_order_acquire) + 1 != s) return {};
      if (const int up = inputs_up(s); up != kUp) {
        if (up == kNotYet) return {};
        return {ErrorCode::kMismatch, "the ranks' collectives are out of line: rank " + std::to_string(up) +
                                          "'s input in the shared segment belongs to another call (a collective "
                                          "refused by its own checks on some rank and run on others, or a different "
                                          "number of collectives); abort the communicator"};
      }
      if (by_shares()) {
        HMC_RETURN_IF_ERROR(reduce_share(s));
        word(own(), red_off(slot(s))).store(s, std::memory_order_release);
        segs_->ring_peers();
        moved = true;
        // A reduce's other ranks are done once their share is up: their slot is not written
        // again before the root, gathering, is done with it too.
        if (w_.kind == CollKind::kAllReduce || segs_->rank() == w_.root) {
          reduced_ = true;
          return {};
        }
      } else {
        HMC_RETURN_IF_ERROR(compute(s));
      }
    } else {
      if (!everyone_at(red_off, s)) return {};
      gather_shares(s);
      reduced_ = false;
    }
    moved = true;
    word(own(), kDoneOff).store(s, std::memory_order_release);
    segs_->ring_peers();
    state_->finished.store(s, std::memory_order_release);
    if (++current_ == rounds_.count) {
      if (rounds_.cma) draining_ = true;
      else finish();
    }
    return {};
  }

  Status compute(uint64_t s) {
    const int n = segs_->size(), me = segs_->rank();
    const std::size_t off = offset(current_), len = length(current_);
    auto* out = static_cast<uint8_t*>(w_.recv);
    switch (w_.kind) {
      case CollKind::kAllReduce: return reduce_range(out + off, s, 0, len);
      case CollKind::kReduce: return me == w_.root ? reduce_range(out + off, s, 0, len) : Status{};
      case CollKind::kAllGather:  // this rank's own block came with publish()
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          if (rounds_.cma) HMC_RETURN_IF_ERROR(read_from(r, s, off, out + r * rounds_.total + off, len));
          else std::memcpy(out + r * rounds_.total + off, data(r, s), len);
        }
        return {};
      case CollKind::kAllToAll:
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          if (!rounds_.cma) {
            std::memcpy(out + r * rounds_.total + off, data(r, s) + me * len, len);
          } else if (w_.send == w_.recv) {  // 2 ranks: put in place by finish()
            if (!aside_scratch_) aside_scratch_.emplace(ctx_, DeviceId{"cpu", 0}, pool_);
            auto p = aside_scratch_->get(len);
            if (!p) return p.status();
            aside_ = p.value();
            HMC_RETURN_IF_ERROR(read_from(r, s, me * rounds_.total, aside_, len));
          } else {
            HMC_RETURN_IF_ERROR(read_from(r, s, me * rounds_.total, out + r * rounds_.total, len));
          }
        }
        return {};
      case CollKind::kReduceScatter: return reduce_range(out + off, s, me * len, me * len + len);
      case CollKind::kBroadcast:
        if (me != w_.root) std::memcpy(out + off, data(w_.root, s), len);
        return {};
      case CollKind::kBarrier: return {};
      default: return {ErrorCode::kInternal, "no shared-segment form of this collective"};
    }
  }

  // dst = the reduction, in rank order, of every rank's bytes [lo, hi) of the round.
  Status reduce_range(uint8_t* dst, uint64_t s, std::size_t lo, std::size_t hi) {
    if (lo >= hi) return {};
    const std::size_t count = (hi - lo) / dtype_size(w_.dtype);
    const bool avg = *w_.op == ReduceOp::kAvg;
    const ReduceOp op = avg ? ReduceOp::kSum : *w_.op;
    std::memcpy(dst, data(0, s) + lo, hi - lo);
    for (int r = 1; r < segs_->size(); ++r)
      HMC_RETURN_IF_ERROR(ctx_.reduce(dst, dst, data(r, s) + lo, count, w_.dtype, op));
    if (avg) HMC_RETURN_IF_ERROR(ctx_.divide(dst, count, w_.dtype, static_cast<uint64_t>(segs_->size())));
    return {};
  }

  // Rank r's share of a round's bytes: whole elements, on cache-line multiples where it can.
  std::pair<std::size_t, std::size_t> share(int r) const {
    const std::size_t len = length(current_), elem = dtype_size(w_.dtype), n = segs_->size();
    std::size_t per = (len / elem + n - 1) / n * elem;
    if (per > 64 && 64 % elem == 0) per = (per + 63) & ~std::size_t{63};
    return {std::min(r * per, len), std::min((r + 1) * per, len)};
  }

  // Whether this round is reduced a share per rank (else whole, on every rank that needs it).
  bool by_shares() const {
    return (w_.kind == CollKind::kAllReduce || w_.kind == CollKind::kReduce) &&
           length(current_) * (segs_->size() - 1) > kWholeReduceMax;
  }

  // This rank's share reduced into its own slot, where the others (a reduce's root) read it
  // (no other rank reads this rank's input there), and into the output where it has one.
  Status reduce_share(uint64_t s) {
    const int me = segs_->rank();
    auto [lo, hi] = share(me);
    const bool root_of_reduce = w_.kind == CollKind::kReduce && me == w_.root;
    uint8_t* dst = nullptr;
    if (w_.kind == CollKind::kAllReduce || root_of_reduce) {
      dst = static_cast<uint8_t*>(w_.recv) + offset(current_) + lo;
    } else {
      scratch_.resize(hi - lo);
      dst = scratch_.data();
    }
    HMC_RETURN_IF_ERROR(reduce_range(dst, s, lo, hi));
    if (!root_of_reduce) std::memcpy(own() + data_off(slot(s)) + lo, dst, hi - lo);
    return {};
  }

  void gather_shares(uint64_t s) {
    uint8_t* out = static_cast<uint8_t*>(w_.recv) + offset(current_);
    for (int r = 0; r < segs_->size(); ++r) {
      auto [lo, hi] = share(r);
      if (r != segs_->rank() && lo < hi) std::memcpy(out + lo, data(r, s) + lo, hi - lo);
    }
  }

  // Finalize or abort here stops the collective at once. A peer lost stops it only once
  // it is `stuck` on what a lost rank never wrote: what a peer published before it left
  // stays in its segment, so rounds whose inputs were all up complete, as they did on the
  // peer, and a rank stuck only on live ones waits for them (a reduce's root for a slow
  // rank's share, while another rank finished and left).
  bool check_failed(bool stuck) {
    if (!segs_->any_failure()) return false;
    Status s = segs_->stopped();
    if (s.ok() && stuck && held_back_by_loss()) s = segs_->loss();
    if (s.ok()) return false;
    fail(s);
    return true;
  }

  // A lost rank has not written a word this rank waits for, or this rank waits for an
  // earlier collective of its own that failed (ShmSeq::failed_from).
  bool held_back_by_loss() const {
    if (state_->failed_from.load(std::memory_order_acquire) < first_) return true;
    for (int r = 0; r < segs_->size(); ++r)
      if (segs_->lost(r) && holds_back(r)) return true;
    return false;
  }

  // Whether rank r's words hold this collective back: the waits of advance(), publish()
  // and run_round(), for one rank.
  bool holds_back(int r) const {
    if (draining_) return !reached(r, done_off, seq(rounds_.count - 1));
    if (published_ < rounds_.count && published_ <= current_ + 1) {
      const uint64_t s = seq(published_);
      if (s > 2 && !reached(r, done_off, s - 2)) return true;
    }
    if (current_ == published_) return false;
    const uint64_t s = seq(current_);
    if (reduced_) return !reached(r, red_off, s);
    return word(segs_->of(r), seq_off(slot(s))).load(std::memory_order_acquire) != (s | call_);
  }

  // Waiters poll closer together while shared-segment collectives are pending (progress.h).
  void end_wait() {
    if (waiting_) result_->engine()->segment_waits(-1, segs_);
    waiting_ = false;
  }

  void fail(const Status& why) {
    if (finished_) return;
    finished_ = true;
    if (first_ < state_->failed_from.load(std::memory_order_relaxed))
      state_->failed_from.store(first_, std::memory_order_release);
    end_wait();
    result_->fail({why.code(), std::string(coll_kind_name(w_.kind)) + ": " + why.message()});
  }

  core::ContextImpl& ctx_;
  const void* comm_;  // the communicator it runs on, only compared (uses())
  std::shared_ptr<core::HostSegments> segs_;
  std::shared_ptr<ShmSeq> state_;
  CclWork w_;
  Rounds rounds_;
  uint64_t first_;
  const uint64_t call_;  // the call's number, shifted into a slot's sequence number
  std::shared_ptr<core::Operation> result_;
  const bool inline_;       // the slot's data sits in its sequence number's line (kInlineBytes)
  uint64_t published_ = 0;  // rounds whose input is in the slots
  uint64_t current_ = 0;    // the round being read
  bool reduced_ = false;    // the current round's share is reduced and published
  bool draining_ = false;   // done reading; waiting for the others to finish with this rank
  std::vector<uint8_t> scratch_;  // a reduce's share on a rank without output
  // An in-place all_to_all's block aside, from the communicator's pool (given to such calls
  // only): blocks of 1 MiB and more are kept there, not faulted in afresh on every call.
  std::shared_ptr<ScratchPool> pool_;
  std::optional<Scratch> aside_scratch_;
  uint8_t* aside_ = nullptr;
  bool finished_ = false;
  bool waiting_ = true;
};

}  // namespace

std::optional<Request> try_shm(core::CommImpl& ci, CommState& state, const CclWork& w, const CollOptions& opt,
                               uint64_t call) {
  const auto& segs = ci.segments();
  const CollSettings& settings = state.settings;
  if (!segs || opt.stream || !opt.algorithm.empty() || settings.algo_set || opt.check.value_or(settings.check))
    return std::nullopt;
  switch (w.kind) {
    case CollKind::kBarrier: break;
    case CollKind::kAllReduce:
    case CollKind::kReduce:
    case CollKind::kAllGather:
    case CollKind::kAllToAll:
    case CollKind::kReduceScatter:
    case CollKind::kBroadcast:
      if (w.send_bytes == 0 || w.count == 0 || (settings.shm_max && w.send_bytes > settings.shm_max)) return std::nullopt;
      break;
    default: return std::nullopt;
  }
  const Rounds rounds = rounds_of(w, segs->size(), segs->cma());
  if (rounds.count == 0) return std::nullopt;
  const uint64_t first = state.shm->next.fetch_add(rounds.count, std::memory_order_relaxed) + 1;
  const bool aside = rounds.cma && w.kind == CollKind::kAllToAll && w.send == w.recv;
  auto op = std::make_unique<ShmColl>(ci, segs, state.shm, w, rounds, first, call, aside ? state.scratch : nullptr);
  Request result(op->result());
  Driver::of(ci.context().engine()).launch(std::move(op));
  return result;
}

}  // namespace hmc::coll
