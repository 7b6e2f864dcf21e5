// The Gloo side of bench/compare-cpu.sh: N ranks forked here, connected over Gloo's TCP
// device on loopback through a file store; one collective over a size sweep, timed the way
// hmc-bench times it, CSV on rank 0 (same columns as mpi_bench).
//
//   gloo_bench -np 4 all_reduce|all_gather|all_to_all -b 8 -e 16M -f 8 -n 20 -w 5 [--timeout S]
//
// Sizes as in nccl-tests: all_reduce sums size/4 floats; all_gather and all_to_all move size
// bytes in all. Per size: -w warm-up calls, a Gloo barrier, -n timed calls; time = elapsed/n
// on every rank, max over ranks; then one call on known data is checked. Options are built
// per call, as PyTorch's Gloo process group does. The store lives in a fresh folder under
// $TMPDIR (or /tmp), removed at the end.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

enum Coll { kAllReduce, kAllGather, kAllToAll };
const char* const kNames[] = {"all_reduce", "all_gather", "all_to_all"};
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

struct Args {
  int coll = -1, ranks = 2, iters = 20, warmup = 5, timeout_s = 600;
  size_t min_b = 8, max_b = 8, factor = 2;
};

bool parse_size(const char* text, size_t& out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v <= 0) return false;
  double mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1024.0, ++end;
  else if (*end == 'm' || *end == 'M') mul = 1024.0 * 1024, ++end;
  else if (*end == 'g' || *end == 'G') mul = 1024.0 * 1024 * 1024, ++end;
  if (*end) return false;
  out = static_cast<size_t>(v * mul);
  return true;
}

float reduce_in(int r, size_t i) { return static_cast<float>((i * 31 + r * 17) % 3); }
uint8_t move_in(int r, size_t i) { return static_cast<uint8_t>((r * 131 + i * 7) % 97); }

void run(const std::shared_ptr<gloo::Context>& ctx, int coll, void* send, void* recv, size_t count) {
  const size_t n = ctx->size;
  if (coll == kAllReduce) {
    gloo::AllreduceOptions o(ctx);
    o.setInput(static_cast<float*>(send), count);
    o.setOutput(static_cast<float*>(recv), count);
    o.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
    gloo::allreduce(o);
  } else if (coll == kAllGather) {
    gloo::AllgatherOptions o(ctx);
    o.setInput(static_cast<uint8_t*>(send), count);
    o.setOutput(static_cast<uint8_t*>(recv), count * n);
    gloo::allgather(o);
  } else {
    gloo::AlltoallOptions o(ctx);
    o.setInput(static_cast<uint8_t*>(send), count * n);
    o.setOutput(static_cast<uint8_t*>(recv), count * n);
    gloo::alltoall(o);
  }
}

long check(const std::shared_ptr<gloo::Context>& ctx, int coll, std::vector<char>& send, std::vector<char>& recv,
           size_t count) {
  const int rank = ctx->rank, n = ctx->size;
  long wrong = 0;
  if (coll == kAllReduce) {
    auto* s = reinterpret_cast<float*>(send.data());
    auto* r = reinterpret_cast<float*>(recv.data());
    for (size_t i = 0; i < count; ++i) s[i] = reduce_in(rank, i);
    std::memset(r, 0xa5, count * sizeof(float));
    run(ctx, coll, s, r, count);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += reduce_in(q, i);
      wrong += r[i] != want;
    }
    return wrong;
  }
  auto* s = reinterpret_cast<uint8_t*>(send.data());
  auto* r = reinterpret_cast<uint8_t*>(recv.data());
  for (size_t i = 0; i < count * (coll == kAllGather ? 1 : n); ++i) s[i] = move_in(rank, i);
  std::memset(r, 0xa5, count * n);
  run(ctx, coll, s, r, count);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < count; ++i) wrong += r[j * count + i] != move_in(j, coll == kAllGather ? i : rank * count + i);
  return wrong;
}

double max_over_ranks(const std::shared_ptr<gloo::Context>& ctx, double v) {
  double out = 0;
  gloo::AllreduceOptions o(ctx);
  o.setInput(&v, 1);
  o.setOutput(&out, 1);
  o.setReduceFunction(static_cast<ReduceFn>(&gloo::max<double>));
  gloo::allreduce(o);
  return out;
}

int rank_main(const Args& a, int rank, const std::string& store_dir) {
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, a.ranks);
  rctx->setTimeout(std::chrono::seconds(a.timeout_s));
  rctx->connectFullMesh(store, dev);
  std::shared_ptr<gloo::Context> ctx = rctx;

  std::vector<char> send(std::max<size_t>(a.max_b, 64), 1), recv(send.size(), 0);
  if (rank == 0) std::printf("collective,ranks,size,count,time_us,wrong\n");
  long wrong_total = 0;
  for (size_t bytes = a.min_b; bytes <= a.max_b; bytes *= a.factor) {
    const size_t count = a.coll == kAllReduce ? bytes / sizeof(float) : bytes / a.ranks;
    const size_t size = a.coll == kAllReduce ? count * sizeof(float) : count * a.ranks;
    for (int i = 0; i < a.warmup; ++i) run(ctx, a.coll, send.data(), recv.data(), count);
    gloo::BarrierOptions b(ctx);
    gloo::barrier(b);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a.iters; ++i) run(ctx, a.coll, send.data(), recv.data(), count);
    double mine = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / a.iters;
    double worst = max_over_ranks(ctx, mine);
    double wrong = max_over_ranks(ctx, static_cast<double>(check(ctx, a.coll, send, recv, count)));
    wrong_total += static_cast<long>(wrong);
    if (rank == 0) std::printf("%s,%d,%zu,%zu,%.3f,%ld\n", kNames[a.coll], a.ranks, size, count, worst, static_cast<long>(wrong));
    std::fflush(stdout);
    if (bytes > a.max_b / a.factor) break;
  }
  return rank == 0 && wrong_total ? 1 : 0;
}

bool parse_args(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    bool ok = true;
    if (k == "-np") ok = (a.ranks = std::atoi(v)) >= 1, ++i;
    else if (k == "-b") ok = parse_size(v, a.min_b), ++i;
    else if (k == "-e") ok = parse_size(v, a.max_b), ++i;
    else if (k == "-f") ok = parse_size(v, a.factor) && a.factor >= 2, ++i;
    else if (k == "-n") ok = (a.iters = std::atoi(v)) > 0, ++i;
    else if (k == "-w") ok = (a.warmup = std::atoi(v)) >= 0, ++i;
    else if (k == "--timeout") ok = (a.timeout_s = std::atoi(v)) > 0, ++i;
    else {
      ok = false;
      for (int c = 0; c < 3; ++c)
        if (k == kNames[c]) a.coll = c, ok = true;
    }
    if (!ok) return std::fprintf(stderr, "gloo_bench: bad argument '%s'\n", argv[i]), false;
  }
  if (a.coll < 0 || a.min_b > a.max_b)
    return std::fprintf(stderr, "usage: gloo_bench -np N all_reduce|all_gather|all_to_all -b MIN -e MAX -f F -n N -w W\n"), false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, a)) return 2;
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/gloo_bench.XXXXXX";
  if (!mkdtemp(tmpl.data())) return std::perror("gloo_bench: mkdtemp"), 1;
  const std::string store_dir = tmpl;
  std::fflush(stdout);

  std::vector<pid_t> pids;
  for (int r = 0; r < a.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo_bench: fork");
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 1;
      try {
        code = rank_main(a, r, store_dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_bench: rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(code);
    }
    pids.push_back(pid);
  }

  // Reap by the deadline; a failed rank leaves the others 10 s before they are killed.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
  int worst = static_cast<int>(pids.size()) == a.ranks ? 0 : 1;
  size_t left = pids.size();
  while (left > 0) {
    for (pid_t& p : pids) {
      int st = 0;
      if (p <= 0 || waitpid(p, &st, WNOHANG) != p) continue;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code && !worst) {
        worst = code;
        deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(10));
      }
      p = -1;
      --left;
    }
    if (left && std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "gloo_bench: killing %zu rank(s) past the deadline\n", left);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      for (pid_t p : pids)
        if (p > 0) waitpid(p, nullptr, 0);
      worst = worst ? worst : 124;
      break;
    }
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  return worst;
}
