// The sweep on one rank. Per row and form: known input, -w warm-up calls, a barrier, -n timed
// calls (both sets each waited for; with -z 0 issued back to back and waited for at the end;
// with --stream each on the rank's device stream, drained where calls are waited for), time
// = elapsed / n on every rank, then rank 0 combines the ranks' times (-a: max by default)
// and sums their wrong elements (point-to-point, so the bookkeeping never runs through the
// collective being measured).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "bench.h"
#include "hmc/collectives.h"

namespace hmc::bench {
namespace {

constexpr uint64_t kResultTag = 0x62656e6368;  // "bench"; below the bit collectives reserve

struct RankResult {
  double time_us = 0;
  uint64_t wrong = 0;
};

std::vector<std::size_t> sizes(const Options& opt) {
  if (opt.coll == Coll::kBarrier) return {0};
  std::vector<std::size_t> out;
  for (std::size_t b = opt.min_bytes; b <= opt.max_bytes; b *= opt.factor) {
    out.push_back(b);
    if (opt.factor < 2 || b > std::numeric_limits<std::size_t>::max() / opt.factor) break;
  }
  return out;
}

class Sweep {
 public:
  Sweep(Context& ctx, Communicator& comm, const Options& opt, Memory send, Memory recv, Stream stream)
      : ctx_(ctx), comm_(comm), opt_(opt), send_(std::move(send)), recv_(std::move(recv)), stream_(std::move(stream)),
        host_(recv_.size()) {
    copt_.stream = stream_.native();
  }

  Result<Timing> measure(const Row& row, const Layout& lay, bool in_place) {
    const int rank = comm_.rank();
    const std::size_t e = dtype_size(row.dtype);
    auto* rbase = static_cast<char*>(recv_.data());
    char* send = in_place ? rbase + lay.send_inplace * rank * e : static_cast<char*>(send_.data());
    char* recv = in_place ? rbase + lay.recv_inplace * rank * e : rbase;
    DataSpec d{opt_.coll, row.dtype, row.op.value_or(ReduceOp::kSum), comm_.size(), std::max(row.root, 0), seed_++};
    auto issue = [&] { return launch(opt_.coll, comm_, send, recv, lay.count, row.dtype, d.op, d.root, copt_); };
    auto call = [&] {
      Request r = issue();
      HMC_RETURN_IF_ERROR(drain());
      return r.wait();
    };

    // Warm-up calls go as the timed ones do (nccl-tests too), so that what a burst of calls
    // in flight sets up (scratch, host staging on a stream) is there before the clock runs.
    auto calls = [&](int n) -> Status {
      if (opt_.blocking) {
        for (int i = 0; i < n; ++i) HMC_RETURN_IF_ERROR(call());
        return {};
      }
      HMC_RETURN_IF_ERROR(back_to_back(issue, n));
      return drain();
    };
    HMC_RETURN_IF_ERROR(prepare(d, lay, send, in_place));
    HMC_RETURN_IF_ERROR(calls(opt_.warmup));
    HMC_RETURN_IF_ERROR(barrier(comm_).wait());
    auto t0 = Clock::now();
    HMC_RETURN_IF_ERROR(calls(opt_.iters));
    RankResult mine{std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / opt_.iters, 0};

    if (opt_.check) {
      d.seed = seed_++;
      HMC_RETURN_IF_ERROR(prepare(d, lay, send, in_place));
      HMC_RETURN_IF_ERROR(barrier(comm_).wait());
      HMC_RETURN_IF_ERROR(call());
      HMC_RETURN_IF_ERROR(ctx_.copy(host_.data(), recv, lay.recv_elems * e));
      mine.wrong = count_wrong(d, lay, rank, host_.data());
    }
    auto all = gather_results(mine);
    if (!all) return all.status();
    return timing(all.value(), lay);
  }

 private:
  // --stream: until the stream ran everything queued on it (a request completes before the
  // stream's own copies behind it).
  Status drain() { return stream_.native() ? stream_.synchronize() : Status(); }

  // -z 0: `n` calls without waiting in between, at most kInFlight pending at a time.
  template <class Issue>
  Status back_to_back(const Issue& issue, int n) {
    constexpr std::size_t kInFlight = 64;
    if (n <= 0) return {};
    std::vector<Request> pending(std::min<std::size_t>(kInFlight, static_cast<std::size_t>(n)));
    for (int i = 0; i < n; ++i) {
      Request& slot = pending[static_cast<std::size_t>(i) % pending.size()];
      if (slot.valid()) HMC_RETURN_IF_ERROR(slot.wait());
      slot = issue();
    }
    // Oldest first, each with its own HMC_TIMEOUT as under -z 1 (wait_all would give the
    // last 64 calls one deadline between them).
    for (std::size_t k = 0; k < pending.size(); ++k)
      if (Request& r = pending[(static_cast<std::size_t>(n) + k) % pending.size()]; r.valid()) HMC_RETURN_IF_ERROR(r.wait());
    return {};
  }

  // Inputs at `send`; outputs poisoned (in-place: the whole buffer, then the input over it).
  Status prepare(const DataSpec& d, const Layout& lay, char* send, bool in_place) {
    const std::size_t e = dtype_size(d.dtype);
    const std::size_t span = std::max(lay.send_elems, lay.recv_elems) * e;
    fill_poison(host_.data(), span);
    HMC_RETURN_IF_ERROR(ctx_.copy(recv_.data(), host_.data(), span));
    fill_input(d, comm_.rank(), host_.data(), lay.send_elems);
    return ctx_.copy(send, host_.data(), lay.send_elems * e);
  }

  Result<std::vector<RankResult>> gather_results(const RankResult& mine) {
    std::vector<RankResult> all(comm_.size());
    if (comm_.rank() != 0) {
      HMC_RETURN_IF_ERROR(comm_.send(&mine, sizeof mine, 0, kResultTag));
      return all;
    }
    all[0] = mine;
    for (int r = 1; r < comm_.size(); ++r) HMC_RETURN_IF_ERROR(comm_.recv(&all[r], sizeof(RankResult), r, kResultTag));
    return all;
  }

  Timing timing(const std::vector<RankResult>& all, const Layout& lay) const {
    Timing t;
    t.ran = true;
    double sum = 0, lo = all[0].time_us, hi = all[0].time_us;
    uint64_t wrong = 0;
    for (const auto& r : all) sum += r.time_us, lo = std::min(lo, r.time_us), hi = std::max(hi, r.time_us), wrong += r.wrong;
    switch (opt_.aggregate) {
      case Aggregate::kRank0: t.time_us = all[0].time_us; break;
      case Aggregate::kAvg: t.time_us = sum / all.size(); break;
      case Aggregate::kMin: t.time_us = lo; break;
      case Aggregate::kMax: t.time_us = hi; break;
    }
    t.algbw = t.time_us > 0 ? static_cast<double>(lay.bytes) / (t.time_us * 1e3) : 0;  // bytes/us/1e3 = GB/s
    t.busbw = t.algbw * lay.bus_factor;
    if (opt_.check) t.wrong = wrong;
    return t;
  }

  Context& ctx_;
  Communicator& comm_;
  const Options& opt_;
  Memory send_, recv_;
  Stream stream_;  // --stream on a device: the calls' stream, else empty
  CollOptions copt_;
  std::vector<unsigned char> host_;
  uint32_t seed_ = 1;
};

}  // namespace

Result<std::vector<Row>> run_sweep(Context& ctx, Communicator& comm, const DeviceId& device, const Options& opt,
                                   SweepHooks& hooks) {
  const std::size_t cap = std::max<std::size_t>(opt.max_bytes, 64);
  auto send = ctx.alloc(device, cap, opt.memory);
  if (!send) return send.status();
  auto recv = ctx.alloc(device, cap, opt.memory);
  if (!recv) return recv.status();
  Stream stream;
  if (opt.stream && device.provider != "cpu") {  // ranks on host memory call without one
    auto made = Stream::create(ctx, device);
    if (!made) return made.status();
    stream = std::move(made.value());
  }
  Sweep sweep(ctx, comm, opt, std::move(send.value()), std::move(recv.value()), std::move(stream));

  const CollTraits tr = traits(opt.coll);
  const auto byte_sizes = sizes(opt);
  std::vector<std::optional<ReduceOp>> ops;
  if (tr.reduces) ops.assign(opt.ops.begin(), opt.ops.end());
  else ops.push_back(std::nullopt);
  std::vector<DataType> dtypes = opt.dtypes;  // a barrier moves no data: one row
  if (opt.coll == Coll::kBarrier) dtypes.resize(1);
  const std::size_t total = dtypes.size() * ops.size() * byte_sizes.size();

  std::vector<Row> rows;
  std::size_t index = 0;
  for (DataType dtype : dtypes) {
    for (const auto& op : ops) {
      for (std::size_t bytes : byte_sizes) {
        const Layout lay = layout(opt.coll, bytes, dtype_size(dtype), comm.size());
        Row row{lay.bytes, lay.count, dtype, op, tr.rooted ? opt.root : -1, {}, {}};
        if (comm.rank() == 0) hooks.begin_row(index++, total, row);
        for (bool in_place : {false, true}) {
          if (!(in_place ? tr.in_place : tr.out_of_place)) continue;
          auto t = sweep.measure(row, lay, in_place);
          // A failed collective may still have transfers of the buffers under way with the
          // peers that are left: the communicator is aborted before the buffers go.
          if (!t) comm.abort();
          if (!t)
            return Status(t.status().code(), std::string(coll_name(opt.coll)) + " " + dtype_name(dtype) + " " +
                                                 (op ? op_name(*op) : "none") + " " + std::to_string(lay.bytes) +
                                                 " B " + (in_place ? "in-place" : "out-of-place") + ": " +
                                                 t.status().message());
          (in_place ? row.in_place : row.out_of_place) = t.value();
        }
        if (comm.rank() == 0) {
          hooks.end_row(row);
          rows.push_back(row);
        }
      }
    }
  }
  return rows;
}

}  // namespace hmc::bench
