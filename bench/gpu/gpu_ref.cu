// hmc-gpu-ref: the NVIDIA references HMC is measured against, in one run on this machine.
//
//   NCCL all_reduce, all_gather, reduce_scatter, all_to_all (grouped ncclSend/ncclRecv) and
//   sendrecv (rank r -> r+1), float32 (sum), one process driving every GPU through
//   ncclCommInitAll; rows as nccl-tests prints them (out-of-place), busbw with its factors.
//   Point-to-point: cudaMemcpyPeer GPU0 -> GPU1 (one way, and both ways at once) and pinned
//   cudaMemcpy host -> device and device -> host.
//
//   hmc-gpu-ref [-b 8] [-e 1G] [-f 2] [-n 20] [-w 5] [-g GPUS] [--p2p-b 64M] [--p2p-e 1G]
//               [--colls all_reduce,all_gather,...] [--no-nccl] [--no-p2p] [--json]
//
// Timing as nccl-tests: warm-up calls, then -n calls launched back to back on every GPU's
// stream, time = elapsed / n after all streams finished. Sizes are total bytes as
// nccl-tests and hmc-bench count them (all_gather: the gathered buffer, reduce_scatter and
// all_to_all: one rank's send buffer). NVLink multicast (NVLS) is always off.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(x)                                                                               \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) die("%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
  } while (0)
#define CHECK_NCCL(x)                                                                               \
  do {                                                                                              \
    ncclResult_t r_ = (x);                                                                          \
    if (r_ != ncclSuccess) die("%s:%d: %s: %s", __FILE__, __LINE__, #x, ncclGetErrorString(r_));   \
  } while (0)

[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "hmc-gpu-ref: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::exit(1);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  size_t min_bytes = 8, max_bytes = 1ull << 30, factor = 2, p2p_min = 64ull << 20, p2p_max = 1ull << 30;
  int iters = 20, warmup = 5, gpus = 0;
  std::vector<std::string> colls = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv"};
  bool nccl = true, p2p = true, json = false;
};

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  size_t mul = *end == 'K' || *end == 'k' ? 1ull << 10 : *end == 'M' || *end == 'm' ? 1ull << 20
             : *end == 'G' || *end == 'g' ? 1ull << 30 : 1;
  if (v <= 0 || (mul == 1 && *end) || (mul > 1 && end[1])) die("bad size '%s' (use e.g. 8, 64K, 4M, 1G)", s);
  return static_cast<size_t>(v * mul);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "-b") o.min_bytes = parse_size(value());
    else if (a == "-e") o.max_bytes = parse_size(value());
    else if (a == "-f") o.factor = std::strtoul(value(), nullptr, 10);
    else if (a == "-n") o.iters = std::atoi(value());
    else if (a == "-w") o.warmup = std::atoi(value());
    else if (a == "-g") o.gpus = std::atoi(value());
    else if (a == "--p2p-b") o.p2p_min = parse_size(value());
    else if (a == "--p2p-e") o.p2p_max = parse_size(value());
    else if (a == "--colls") {
      o.colls.clear();
      std::string list = value();
      for (size_t p = 0; p <= list.size();) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        if (q > p) o.colls.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--no-nccl") o.nccl = false;
    else if (a == "--no-p2p") o.p2p = false;
    else if (a == "--json") o.json = true;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: hmc-gpu-ref [-b 8] [-e 1G] [-f 2] [-n 20] [-w 5] [-g GPUS] [--p2p-b 64M] [--p2p-e 1G]\n"
                  "                   [--colls all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv]\n"
                  "                   [--no-nccl] [--no-p2p] [--json]\n");
      std::exit(0);
    } else die("unknown argument '%s' (see --help)", a.c_str());
  }
  if (o.factor < 2 || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes || o.p2p_min > o.p2p_max)
    die("bad arguments: need -f >= 2, -n >= 1, -w >= 0, -b <= -e, --p2p-b <= --p2p-e");
  for (const auto& c : o.colls)
    if (c != "all_reduce" && c != "all_gather" && c != "reduce_scatter" && c != "all_to_all" && c != "sendrecv")
      die("unknown collective '%s'", c.c_str());
  return o;
}

struct Row {
  std::string what;
  size_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
};

// NCCL on every GPU from this one thread.
class Nccl {
 public:
  Nccl(int n, size_t cap) : n_(n), comms_(n), streams_(n), send_(n), recv_(n) {
    std::vector<int> devs(n);
    for (int d = 0; d < n; ++d) devs[d] = d;
    CHECK_NCCL(ncclCommInitAll(comms_.data(), n, devs.data()));
    for (int d = 0; d < n; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking));
      CHECK_CUDA(cudaMalloc(&send_[d], cap));
      CHECK_CUDA(cudaMalloc(&recv_[d], cap));
      CHECK_CUDA(cudaMemset(send_[d], 0, cap));  // zeros: every float op stays finite
      CHECK_CUDA(cudaMemset(recv_[d], 0, cap));
    }
    for (int d = 0; d < n; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
  }
  ~Nccl() {
    for (int d = 0; d < n_; ++d) {
      cudaSetDevice(d);
      cudaFree(send_[d]);
      cudaFree(recv_[d]);
      cudaStreamDestroy(streams_[d]);
      ncclCommDestroy(comms_[d]);
    }
  }

  // One row: `bytes` as nccl-tests labels it; false when it holds less than one element per rank.
  bool measure(const std::string& coll, size_t bytes, const Options& o, Row& row) {
    const size_t total = bytes / sizeof(float), per_rank = total / n_;
    double factor = 1;
    size_t count = total;
    if (coll == "all_reduce") factor = 2.0 * (n_ - 1) / n_;
    else if (coll == "sendrecv") factor = 1;
    else count = per_rank, factor = static_cast<double>(n_ - 1) / n_;
    if (count == 0) return false;
    const size_t label = (coll == "all_reduce" || coll == "sendrecv" ? count : count * n_) * sizeof(float);
    auto launch = [&] {
      CHECK_NCCL(ncclGroupStart());
      for (int d = 0; d < n_; ++d) call(coll, d, count);
      CHECK_NCCL(ncclGroupEnd());
    };
    for (int i = 0; i < o.warmup; ++i) launch();
    sync();
    auto t0 = Clock::now();
    for (int i = 0; i < o.iters; ++i) launch();
    sync();
    const double us = seconds_since(t0) * 1e6 / o.iters;
    row = {coll, label, count, us, label / (us * 1e3), label / (us * 1e3) * factor};
    return true;
  }

 private:
  void call(const std::string& coll, int d, size_t count) {
    const ncclComm_t c = comms_[d];
    const cudaStream_t s = streams_[d];
    float *src = static_cast<float*>(send_[d]), *dst = static_cast<float*>(recv_[d]);
    if (coll == "all_reduce") CHECK_NCCL(ncclAllReduce(src, dst, count, ncclFloat, ncclSum, c, s));
    else if (coll == "all_gather") CHECK_NCCL(ncclAllGather(src, dst, count, ncclFloat, c, s));
    else if (coll == "reduce_scatter") CHECK_NCCL(ncclReduceScatter(src, dst, count, ncclFloat, ncclSum, c, s));
    else if (coll == "all_to_all") {
      for (int p = 0; p < n_; ++p) {
        CHECK_NCCL(ncclSend(src + p * count, count, ncclFloat, p, c, s));
        CHECK_NCCL(ncclRecv(dst + p * count, count, ncclFloat, p, c, s));
      }
    } else {  // sendrecv: to the next rank, from the previous one
      CHECK_NCCL(ncclSend(src, count, ncclFloat, (d + 1) % n_, c, s));
      CHECK_NCCL(ncclRecv(dst, count, ncclFloat, (d + n_ - 1) % n_, c, s));
    }
  }
  void sync() {
    for (int d = 0; d < n_; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaStreamSynchronize(streams_[d]));
    }
  }

  int n_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> send_, recv_;
};

// GB/s of `iters` rounds of `round` (which queues copies moving `bytes_per_round` in all).
template <class F>
double copy_gbps(size_t bytes_per_round, int iters, F round, const std::vector<int>& devs) {
  auto sync = [&] {
    for (int d : devs) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
  };
  round(), round(), sync();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) round();
  sync();
  return static_cast<double>(bytes_per_round) * iters / seconds_since(t0) / 1e9;
}

std::vector<Row> p2p_rows(int n, const Options& o) {
  std::vector<Row> rows;
  const size_t cap = o.p2p_max;
  std::vector<void*> a(n), b(n);
  std::vector<cudaStream_t> s(n);
  for (int d = 0; d < n; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaMalloc(&a[d], cap));
    CHECK_CUDA(cudaMalloc(&b[d], cap));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
  }
  int peer = 0;
  if (n >= 2) {
    CHECK_CUDA(cudaDeviceCanAccessPeer(&peer, 0, 1));
    for (int d = 0; d < 2 && peer; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) die("peer access: %s", cudaGetErrorString(e));
    }
    if (!peer) std::fprintf(stderr, "hmc-gpu-ref: GPU 0 cannot access GPU 1 directly; cudaMemcpyPeer is staged\n");
  }
  void* host = nullptr;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMallocHost(&host, cap));
  std::memset(host, 1, cap);
  const int iters = o.iters;
  for (size_t bytes = o.p2p_min; bytes <= o.p2p_max; bytes *= 4) {
    auto add = [&](const char* what, size_t moved, double gbps) {  // time of one round moving `moved` bytes
      rows.push_back({what, bytes, 0, moved / (gbps * 1e3), gbps, gbps});
    };
    if (n >= 2) {
      add("memcpy_peer_0to1", bytes, copy_gbps(bytes, iters, [&] {
        CHECK_CUDA(cudaMemcpyPeerAsync(a[1], 1, a[0], 0, bytes, s[0]));
      }, {0, 1}));
      add("memcpy_peer_bidir", 2 * bytes, copy_gbps(2 * bytes, iters, [&] {
        CHECK_CUDA(cudaMemcpyPeerAsync(a[1], 1, a[0], 0, bytes, s[0]));
        CHECK_CUDA(cudaMemcpyPeerAsync(b[0], 0, b[1], 1, bytes, s[1]));
      }, {0, 1}));
    }
    CHECK_CUDA(cudaSetDevice(0));
    add("pinned_h2d", bytes, copy_gbps(bytes, iters, [&] {
      CHECK_CUDA(cudaMemcpyAsync(a[0], host, bytes, cudaMemcpyHostToDevice, s[0]));
    }, {0}));
    add("pinned_d2h", bytes, copy_gbps(bytes, iters, [&] {
      CHECK_CUDA(cudaMemcpyAsync(host, a[0], bytes, cudaMemcpyDeviceToHost, s[0]));
    }, {0}));
    if (bytes > o.p2p_max / 4) break;
  }
  CHECK_CUDA(cudaFreeHost(host));
  for (int d = 0; d < n; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaFree(a[d]));
    CHECK_CUDA(cudaFree(b[d]));
    CHECK_CUDA(cudaStreamDestroy(s[d]));
  }
  return rows;
}

void print_json(const char* nccl, const std::vector<std::string>& gpus, const std::vector<Row>& colls,
                const std::vector<Row>& p2p, const Options& o) {
  std::printf("{\n  \"tool\": \"hmc-gpu-ref\",\n  \"nccl_version\": \"%s\",\n  \"nvls_enable\": \"%s\",\n  \"iters\": %d,\n"
              "  \"warmup\": %d,\n  \"gpus\": [", nccl, std::getenv("NCCL_NVLS_ENABLE"), o.iters, o.warmup);
  for (size_t i = 0; i < gpus.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", gpus[i].c_str());
  std::printf("],\n  \"collectives\": [");
  for (size_t i = 0; i < colls.size(); ++i) {
    const Row& r = colls[i];
    std::printf("%s\n    {\"collective\": \"%s\", \"ranks\": %zu, \"size\": %zu, \"count\": %zu, \"type\": \"float32\", "
                "\"redop\": \"%s\", \"time_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}",
                i ? "," : "", r.what.c_str(), gpus.size(), r.bytes, r.count,
                r.what == "all_reduce" || r.what == "reduce_scatter" ? "sum" : "none", r.time_us, r.algbw, r.busbw);
  }
  std::printf("\n  ],\n  \"p2p\": [");
  for (size_t i = 0; i < p2p.size(); ++i)
    std::printf("%s\n    {\"test\": \"%s\", \"size\": %zu, \"time_us\": %.3f, \"gbps\": %.4f}", i ? "," : "",
                p2p[i].what.c_str(), p2p[i].bytes, p2p[i].time_us, p2p[i].algbw);
  std::printf("\n  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  // NVLink multicast stays off on these machines, whatever the caller's environment says.
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (nvls && std::strcmp(nvls, "0") != 0) std::fprintf(stderr, "hmc-gpu-ref: NCCL_NVLS_ENABLE=%s overridden to 0\n", nvls);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const Options o = parse(argc, argv);

  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  const int n = o.gpus > 0 ? std::min(o.gpus, count) : count;
  if (n < 1) die("no GPU");
  std::vector<std::string> gpus;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    CHECK_CUDA(cudaGetDeviceProperties(&p, d));
    char bus[32];
    CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, d));
    gpus.push_back(std::string(p.name) + " " + bus);
  }
  int v = 0;
  CHECK_NCCL(ncclGetVersion(&v));
  char nccl[32];
  std::snprintf(nccl, sizeof nccl, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);

  if (!o.json) {
    std::printf("# hmc-gpu-ref  NCCL %s  NCCL_NVLS_ENABLE=0  GPUs: %d  iters: %d  warmup: %d\n", nccl, n, o.iters, o.warmup);
    for (int d = 0; d < n; ++d) std::printf("#  GPU %d: %s\n", d, gpus[d].c_str());
  }
  std::vector<Row> colls, p2p;
  if (o.nccl) {
    Nccl nc(n, o.max_bytes);
    for (const auto& c : o.colls) {
      if (!o.json)
        std::printf("#\n# %s (NCCL, float32%s, out-of-place)\n#%11s  %12s  %10s  %8s  %8s\n", c.c_str(),
                    c == "all_reduce" || c == "reduce_scatter" ? " sum" : "", "size (B)", "count", "time (us)",
                    "algbw", "busbw");
      for (size_t b = o.min_bytes; b <= o.max_bytes; b *= o.factor) {
        Row r;
        if (!nc.measure(c, b, o, r)) continue;
        colls.push_back(r);
        if (!o.json) std::printf("%12zu  %12zu  %10.2f  %8.2f  %8.2f\n", r.bytes, r.count, r.time_us, r.algbw, r.busbw);
        std::fflush(stdout);
        if (b > o.max_bytes / o.factor) break;
      }
    }
  }
  if (o.p2p) {
    p2p = p2p_rows(n, o);
    if (!o.json) {
      std::printf("#\n# point-to-point copies (GB/s; bidir counts both directions)\n#%11s  %-18s  %10s  %8s\n",
                  "size (B)", "test", "time (us)", "GB/s");
      for (const auto& r : p2p) std::printf("%12zu  %-18s  %10.2f  %8.2f\n", r.bytes, r.what.c_str(), r.time_us, r.algbw);
    }
  }
  if (o.json) print_json(nccl, gpus, colls, p2p, o);
  return 0;
}
