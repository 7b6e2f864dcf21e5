// hmc-bench internals: the collectives it measures, their buffer layouts, known data,
// the per-rank sweep and the nccl-tests style report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hmc/hmc.h"

namespace hmc::bench {

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll, kGather, kScatter,
                  kSendRecv, kBarrier };

// How the time of one size is combined over ranks (nccl-tests' -a values).
enum class Aggregate { kRank0 = 0, kAvg = 1, kMin = 2, kMax = 3 };

struct Options {
  Coll coll = Coll::kAllReduce;
  std::size_t min_bytes = 32u << 20, max_bytes = 32u << 20;
  std::size_t factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0;
  // -z (nccl-tests' flag): 1 waits for each timed call before the next; 0 issues them back to
  // back (up to kInFlight pending) and waits at the end, as nccl-tests does by default.
  int blocking = 1;
  Aggregate aggregate = Aggregate::kMax;
  std::vector<DataType> dtypes = {DataType::kFloat32};
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  std::string device = "cpu";  // provider[:index][@ranks], see tools/common/device_spec.h
  AllocKind memory = AllocKind::kDefault;  // how the send and receive buffers are allocated
  // --stream: ranks whose buffers are on a device call on a device stream (CollOptions::stream),
  // timed as nccl-tests times: calls queued, then the stream drained.
  bool stream = false;
  enum class Format { kTable, kJson, kCsv } format = Format::kTable;
  bool progress = false;  // also without a terminal on stderr
};

std::optional<Coll> parse_coll(const std::string& name);
const char* coll_name(Coll c);
const std::vector<std::string>& coll_names();

// One measured form (out-of-place or in-place) of one row.
struct Timing {
  bool ran = false;  // false where HMC has no such form (broadcast out-of-place, sendrecv in-place)
  double time_us = 0, algbw = 0, busbw = 0;
  std::optional<uint64_t> wrong;  // empty when not checked
};

struct Row {
  std::size_t bytes = 0, count = 0;
  DataType dtype = DataType::kFloat32;
  std::optional<ReduceOp> op;  // empty for collectives that do not reduce
  int root = -1;               // -1 for collectives without a root
  Timing out_of_place, in_place;
};

// Element counts of one size of one collective on `n` ranks, as nccl-tests defines them.
struct Layout {
  std::size_t count = 0;                   // the count column: the `count` argument of the call
  std::size_t send_elems = 0, recv_elems = 0;
  std::size_t send_inplace = 0, recv_inplace = 0;  // in-place: offsets (x rank) into one buffer
  std::size_t bytes = 0;                   // the size column: max(send, recv) bytes
  double bus_factor = 1;                   // busbw = algbw x bus_factor
};

struct CollTraits {
  bool reduces = false, rooted = false;
  bool out_of_place = true, in_place = true;
};

CollTraits traits(Coll c);
Layout layout(Coll c, std::size_t bytes, std::size_t elem_size, int n);
Request launch(Coll c, Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
               ReduceOp op, int root, const CollOptions& opt = {});

// Known data: inputs every rank can compute for every rank, and the expected outputs.
struct DataSpec {
  Coll coll;
  DataType dtype;
  ReduceOp op;
  int n = 1, root = 0;
  uint32_t seed = 0;
};
double input_value(const DataSpec& d, int rank, std::size_t i);
void fill_input(const DataSpec& d, int rank, void* host, std::size_t elems);
void fill_poison(void* host, std::size_t bytes);
// Wrong elements in `host` (this rank's output of `lay`), 0 where the rank has no output.
uint64_t count_wrong(const DataSpec& d, const Layout& lay, int rank, const void* host);

// Runs the sweep on this rank; rank 0 returns the rows (others an empty vector).
struct SweepHooks {
  virtual ~SweepHooks() = default;
  virtual void begin_row(std::size_t index, std::size_t total, const Row& row) = 0;
  virtual void end_row(const Row& row) = 0;
};
Result<std::vector<Row>> run_sweep(Context& ctx, Communicator& comm, const DeviceId& device, const Options& opt,
                                   SweepHooks& hooks);

// The report (rank 0): nccl-tests table, JSON or CSV.
struct RunInfo {
  int ranks = 1;
  std::string device;
  std::vector<std::string> rank_lines;  // "Rank 0 Pid 123 on host device cpu:0"
};
class Report : public SweepHooks {
 public:
  Report(const Options& opt, RunInfo info);
  void header();
  void begin_row(std::size_t index, std::size_t total, const Row& row) override;
  void end_row(const Row& row) override;
  // Footer (or the whole JSON document); returns the wrong-element total.
  uint64_t footer(const std::vector<Row>& rows);

 private:
  void clear_progress();
  Options opt_;
  RunInfo info_;
  bool progress_ = false, progress_tty_ = false, progress_shown_ = false;
};

}  // namespace hmc::bench
