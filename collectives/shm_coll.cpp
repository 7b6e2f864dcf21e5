#include "collectives/shm_coll.h"

#include <atomic>
#include <cstring>

#include "collectives/comm_state.h"
#include "collectives/driver.h"
#include "collectives/driver_op.h"
#include "collectives/select.h"
#include "core/comm_impl.h"

namespace hmc::coll {
namespace {

// Layout of a rank's segment: the last sequence number it finished reading, then two
// slots of a published sequence number and the input, each on its own cache lines.
constexpr std::size_t kDoneOff = 0;
constexpr std::size_t kSlotStride = 64 + kSlotBytes;
constexpr std::size_t seq_off(uint64_t b) { return 64 + b * kSlotStride; }
constexpr std::size_t data_off(uint64_t b) { return 128 + b * kSlotStride; }
static_assert(data_off(1) + kSlotBytes <= core::HostSegments::kBytes);

std::atomic_ref<uint64_t> word(uint8_t* seg, std::size_t off) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(seg + off));
}

class ShmColl final : public DriverOp {
 public:
  ShmColl(core::CommImpl& comm, std::shared_ptr<core::HostSegments> segs, std::shared_ptr<ShmSeq> state,
          const CclWork& w, uint64_t seq)
      : ctx_(comm.context()), segs_(std::move(segs)), state_(std::move(state)), w_(w), seq_(seq),
        result_(core::Operation::make(comm.context().engine())) {
    result_->engine()->segment_waits(+1);
  }
  ~ShmColl() override { end_wait(); }

  const std::shared_ptr<core::Operation>& result() const { return result_; }
  void start() override { advance(); }
  bool finished() const override { return finished_; }
  void abandon(Status why) override {
    fail(why);
    // The context, whose cpu provider would release the mappings, is going away: keep them.
    static std::mutex mu;
    static auto* graveyard = new std::vector<std::shared_ptr<core::HostSegments>>();
    std::lock_guard lock(mu);
    graveyard->push_back(std::move(segs_));
  }

  bool advance() override {
    if (finished_) return false;
    bool moved = false;
    if (!published_) {
      if (!publish()) return check_failed();
      moved = published_ = true;
    }
    if (!everyone_published()) return check_failed() || moved;
    if (Status s = compute(); !s.ok()) {
      fail(s);
      return true;
    }
    word(segs_->of(segs_->rank()), kDoneOff).store(seq_, std::memory_order_release);
    state_->finished.store(seq_, std::memory_order_release);
    finished_ = true;
    end_wait();
    result_->complete(w_.result_bytes);
    return true;
  }

 private:
  uint64_t slot() const { return seq_ & 1; }

  // Into this rank's slot, once every rank finished reading it (two collectives ago).
  bool publish() {
    for (int r = 0; r < segs_->size(); ++r)
      if (word(segs_->of(r), kDoneOff).load(std::memory_order_acquire) + 2 < seq_) return false;
    uint8_t* mine = segs_->of(segs_->rank());
    std::memcpy(mine + data_off(slot()), w_.send, w_.send_bytes);
    word(mine, seq_off(slot())).store(seq_, std::memory_order_release);
    return true;
  }

  // Every rank's input is up, and this rank finished the collective before this one.
  bool everyone_published() const {
    if (state_->finished.load(std::memory_order_acquire) + 1 != seq_) return false;
    for (int r = 0; r < segs_->size(); ++r)
      if (word(segs_->of(r), seq_off(slot())).load(std::memory_order_acquire) < seq_) return false;
    return true;
  }

  const uint8_t* input(int r) const { return segs_->of(r) + data_off(slot()); }

  Status compute() {
    const int n = segs_->size(), me = segs_->rank();
    auto* out = static_cast<uint8_t*>(w_.recv);
    switch (w_.kind) {
      case CollKind::kAllReduce: {
        const bool avg = *w_.op == ReduceOp::kAvg;
        const ReduceOp op = avg ? ReduceOp::kSum : *w_.op;
        std::memcpy(out, input(0), w_.send_bytes);
        for (int r = 1; r < n; ++r) HMC_RETURN_IF_ERROR(ctx_.reduce(out, out, input(r), w_.count, w_.dtype, op));
        if (avg) HMC_RETURN_IF_ERROR(ctx_.divide(out, w_.count, w_.dtype, static_cast<uint64_t>(n)));
        return {};
      }
      case CollKind::kAllGather:
        for (int r = 0; r < n; ++r) std::memcpy(out + r * w_.send_bytes, input(r), w_.send_bytes);
        return {};
      case CollKind::kAllToAll: {
        const std::size_t block = w_.send_bytes / n;
        for (int r = 0; r < n; ++r) std::memcpy(out + r * block, input(r) + me * block, block);
        return {};
      }
      default: return {ErrorCode::kInternal, "no shared-segment form of this collective"};
    }
  }

  bool check_failed() {
    if (Status s = segs_->failed(); !s.ok()) {
      fail(s);
      return true;
    }
    return false;
  }

  // Waiters poll closer together while shared-segment collectives are pending (progress.h).
  void end_wait() {
    if (waiting_) result_->engine()->segment_waits(-1);
    waiting_ = false;
  }

  void fail(const Status& why) {
    if (finished_) return;
    finished_ = true;
    end_wait();
    result_->fail({why.code(), std::string(coll_kind_name(w_.kind)) + ": " + why.message()});
  }

  core::ContextImpl& ctx_;
  std::shared_ptr<core::HostSegments> segs_;
  std::shared_ptr<ShmSeq> state_;
  CclWork w_;
  uint64_t seq_;
  std::shared_ptr<core::Operation> result_;
  bool published_ = false;
  bool finished_ = false;
  bool waiting_ = true;
};

}  // namespace

std::optional<Request> try_shm(core::CommImpl& ci, CommState& state, const CclWork& w, const CollOptions& opt) {
  const auto& segs = ci.segments();
  const CollSettings& settings = state.settings;
  if (!segs || opt.stream || !opt.algorithm.empty() || settings.algo_set || opt.check.value_or(settings.check))
    return std::nullopt;
  if (w.kind != CollKind::kAllReduce && w.kind != CollKind::kAllGather && w.kind != CollKind::kAllToAll)
    return std::nullopt;
  if (w.send_bytes == 0 || w.send_bytes > kSlotBytes) return std::nullopt;
  const uint64_t seq = state.shm->next.fetch_add(1, std::memory_order_relaxed) + 1;
  auto op = std::make_unique<ShmColl>(ci, segs, state.shm, w, seq);
  Request result(op->result());
  Driver::of(ci.context().engine()).launch(std::move(op));
  return result;
}

}  // namespace hmc::coll
