#include "collectives/stream_stage.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/context_impl.h"
#include "core/log.h"

namespace hmc::coll {
namespace {

constexpr std::size_t kAlign = 64;

std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One registered host block, back to its pool when the last holder lets go.
struct Block {
  Block(std::shared_ptr<ScratchPool> pool, core::LoadedProvider* p, uint8_t* ptr, std::size_t size)
      : pool(std::move(pool)), p(p), ptr(ptr), size(size) {}
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { pool->give_staging(p, ptr, size); }
  std::shared_ptr<ScratchPool> pool;
  core::LoadedProvider* p;
  uint8_t* ptr;
  std::size_t size;
};

}  // namespace

Result<StreamStage> StreamStage::make(core::ContextImpl& ctx, const std::shared_ptr<ScratchPool>& pool,
                                      std::size_t limit, const void* where, const std::vector<Extent>& in,
                                      const std::vector<Extent>& out) {
  StreamStage st;
  const auto home = ctx.mem_info(where, 1);
  if (!where || !home.device_mem) return st;
  core::LoadedProvider* p = home.provider;
  auto staged = [&](const Extent& e) {
    if (!e.p || e.bytes == 0) return false;
    const auto m = ctx.mem_info(e.p, e.bytes);
    return m.device_mem && m.provider == p && m.device == home.device;
  };
  // Each extent looked up once (mem_info takes the allocation table's lock).
  std::vector<Extent> ins, outs;
  for (const Extent& e : in)
    if (staged(e)) ins.push_back(e);
  for (const Extent& e : out)
    if (staged(e)) outs.push_back(e);
  if (ins.empty() && outs.empty()) return st;
  std::vector<Extent> all = ins;
  all.insert(all.end(), outs.begin(), outs.end());
  if (!(p->dev->caps & HMC_DEV_CAP_HOST_REGISTER)) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      HMC_LOG("coll", warn, "{} cannot register host memory: stream-ordered collectives run on its device buffers, "
              "which hangs where streams share a hardware queue", p->name);
    return st;
  }
  // Overlapping or touching buffers (in-place layouts) share one span.
  std::sort(all.begin(), all.end(), [](const Extent& a, const Extent& b) { return a.p < b.p; });
  for (const Extent& e : all) {
    const auto* b = static_cast<const uint8_t*>(e.p);
    if (!st.spans_.empty() && b <= st.spans_.back().user + st.spans_.back().bytes) {
      Span& s = st.spans_.back();
      s.bytes = std::max<std::size_t>(s.bytes, b + e.bytes - s.user);
    } else {
      st.spans_.push_back({b, e.bytes, nullptr});
    }
  }
  std::size_t total = 0;
  for (const Span& s : st.spans_) total += aligned(s.bytes);
  // Within HMC_STREAM_STAGE_MAX: wait for this stream (or another) to pass earlier calls
  // and give their blocks back; sweeping the retirement list is what gives them back.
  std::size_t size = 0;
  Result<uint8_t*> block = nullptr;
  for (const auto deadline = ctx.deadline();;) {
    block = pool->take_staging(p, total, limit, size);
    if (!block || block.value()) break;
    if (core::Clock::now() > deadline)
      return Status(ErrorCode::kTimeout, "host staging for a stream-ordered call: HMC_STREAM_STAGE_MAX (" +
                                             std::to_string(limit) + " bytes) is held by earlier calls whose streams "
                                             "have not passed them after HMC_TIMEOUT");
    ctx.stream_retirement().sweep();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (!block) {
    HMC_LOG("coll", warn, "no host staging for a stream-ordered collective ({}): it runs on the device buffers",
            block.status().to_string());
    return StreamStage();
  }
  st.keep_ = std::make_shared<Block>(pool, p, block.value(), size);
  uint8_t* next = block.value();
  for (Span& s : st.spans_) {
    s.host = next;
    next += aligned(s.bytes);
  }
  for (const Extent& e : ins) st.in_.push_back({st.host_of(e.p), e.p, e.bytes});
  for (const Extent& e : outs) st.out_.push_back({const_cast<void*>(e.p), st.host_of(e.p), e.bytes});
  return st;
}

uint8_t* StreamStage::host_of(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const Span& s : spans_)
    if (b >= s.user && b <= s.user + s.bytes) return s.host + (b - s.user);
  return nullptr;
}

void StreamStage::apply(Schedule& s, Scratch& scratch) const {
  if (spans_.empty()) return;
  for (const Span& sp : spans_) s.rebase(sp.user, sp.bytes, sp.host);
  scratch.hold(keep_);
}

}  // namespace hmc::coll
