// What rank 0 prints: the nccl-tests table (rows as they finish), CSV, or one JSON document;
// the progress line goes to stderr.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench.h"

namespace hmc::bench {
namespace {

const char* kAggregateNames[] = {"rank 0", "avg", "min", "max"};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string time_text(double us) { return fmt(us < 1e4 ? "%.2f" : us < 1e5 ? "%.1f" : "%.0f", us); }

std::string wrong_text(const Timing& t) { return t.wrong ? std::to_string(*t.wrong) : "N/A"; }

void print_table_row(const Row& r) {
  std::printf("%12zu  %12zu  %8s  %6s  %6d", r.bytes, r.count, dtype_name(r.dtype), r.op ? op_name(*r.op) : "none",
              r.root);
  for (const Timing* t : {&r.out_of_place, &r.in_place}) {
    if (t->ran)
      std::printf("  %8s  %6.2f  %6.2f  %6s", time_text(t->time_us).c_str(), t->algbw, t->busbw, wrong_text(*t).c_str());
    else
      std::printf("  %8s  %6s  %6s  %6s", "-", "-", "-", "-");
  }
  std::printf("\n");
  std::fflush(stdout);
}

void print_csv_row(Coll c, int ranks, const Row& r) {
  std::printf("%s,%d,%zu,%zu,%s,%s,%d", coll_name(c), ranks, r.bytes, r.count, dtype_name(r.dtype),
              r.op ? op_name(*r.op) : "none", r.root);
  for (const Timing* t : {&r.out_of_place, &r.in_place}) {
    if (t->ran)
      std::printf(",%.3f,%.4f,%.4f,%s", t->time_us, t->algbw, t->busbw, t->wrong ? std::to_string(*t->wrong).c_str() : "");
    else
      std::printf(",,,,");
  }
  std::printf("\n");
  std::fflush(stdout);
}

nlohmann::ordered_json timing_json(const Timing& t) {
  if (!t.ran) return nullptr;
  nlohmann::ordered_json j = {{"time_us", t.time_us}, {"algbw_gbps", t.algbw}, {"busbw_gbps", t.busbw}};
  j["wrong"] = t.wrong ? nlohmann::ordered_json(*t.wrong) : nlohmann::ordered_json(nullptr);
  return j;
}

}  // namespace

Report::Report(const Options& opt, RunInfo info) : opt_(opt), info_(std::move(info)) {
  progress_tty_ = isatty(STDERR_FILENO);
  progress_ = progress_tty_ || opt.progress;
}

void Report::header() {
  if (opt_.format == Options::Format::kCsv)
    std::printf("collective,ranks,size,count,type,redop,root,oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,"
                "ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong\n");
  if (opt_.format != Options::Format::kTable) return;
  std::printf("# hmc-bench %s  ranks: %d  device: %s  minBytes: %zu  maxBytes: %zu  step: %zu(factor)  "
              "warmup iters: %d  iters: %d  validation: %d  time: %s over ranks\n#\n# Using devices\n",
              coll_name(opt_.coll), info_.ranks, info_.device.c_str(), opt_.min_bytes, opt_.max_bytes, opt_.factor,
              opt_.warmup, opt_.iters, opt_.check, kAggregateNames[static_cast<int>(opt_.aggregate)]);
  for (const auto& line : info_.rank_lines) std::printf("#  %s\n", line.c_str());
  std::printf("#\n");
  std::printf("#%62s%s%24s%s\n", "", "out-of-place", "", "in-place");
  std::printf("#%11s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s  %8s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("#%11s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s  %8s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

void Report::clear_progress() {
  if (progress_shown_ && progress_tty_) std::fprintf(stderr, "\r\033[K");
  progress_shown_ = false;
}

void Report::begin_row(std::size_t index, std::size_t total, const Row& row) {
  if (!progress_) return;
  clear_progress();
  std::fprintf(stderr, "# hmc-bench [%zu/%zu] %s %s %s %zu B%s", index + 1, total, coll_name(opt_.coll),
               dtype_name(row.dtype), row.op ? op_name(*row.op) : "none", row.bytes, progress_tty_ ? "" : "\n");
  std::fflush(stderr);
  progress_shown_ = true;
}

void Report::end_row(const Row& row) {
  clear_progress();
  if (opt_.format == Options::Format::kTable) print_table_row(row);
  else if (opt_.format == Options::Format::kCsv) print_csv_row(opt_.coll, info_.ranks, row);
}

uint64_t Report::footer(const std::vector<Row>& rows) {
  clear_progress();
  uint64_t wrong = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (const auto& r : rows)
    for (const Timing* t : {&r.out_of_place, &r.in_place}) {
      if (!t->ran) continue;
      wrong += t->wrong.value_or(0);
      bw_sum += t->busbw;
      ++bw_count;
    }
  const double avg_bw = bw_count ? bw_sum / bw_count : 0;
  if (opt_.format == Options::Format::kTable) {
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong), wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", avg_bw);
  } else if (opt_.format == Options::Format::kJson) {
    nlohmann::ordered_json j = {{"tool", "hmc-bench"}, {"collective", coll_name(opt_.coll)}, {"ranks", info_.ranks},
                        {"device", info_.device}, {"min_bytes", opt_.min_bytes}, {"max_bytes", opt_.max_bytes},
                        {"factor", opt_.factor}, {"iters", opt_.iters}, {"warmup", opt_.warmup},
                        {"check", opt_.check}, {"time_over_ranks", kAggregateNames[static_cast<int>(opt_.aggregate)]},
                        {"wrong_total", wrong}, {"avg_busbw_gbps", avg_bw}};
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& r : rows)
      j["rows"].push_back({{"size", r.bytes}, {"count", r.count}, {"type", dtype_name(r.dtype)},
                           {"redop", r.op ? nlohmann::ordered_json(op_name(*r.op)) : nlohmann::ordered_json(nullptr)},
                           {"root", r.root}, {"out_of_place", timing_json(r.out_of_place)},
                           {"in_place", timing_json(r.in_place)}});
    std::cout << j.dump(2) << "\n";
  }
  std::fflush(stdout);
  return wrong;
}

}  // namespace hmc::bench
