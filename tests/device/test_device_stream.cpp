// Stream-ordered collectives (CollOptions::stream): the collective starts after the work
// queued on the stream before the call and work queued after it waits for it, while the
// calling thread returns at once. With the emulated provider's per-operation delay
// (HMC_EMU_STREAM_DELAY_US) a collective that started early would read the old input.
// ctest runs them again with every stream in one hardware queue (HMC_EMU_QUEUES=1, as
// CUDA_DEVICE_MAX_CONNECTIONS=1): device work queued after the call would hang there.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "device_support.h"

using namespace hmc;
using namespace hmc::test;

namespace {

constexpr auto kWait = std::chrono::seconds(60);

int ordered_all_reduce(RankEnv& e, std::size_t count) {
  const std::size_t bytes = count * sizeof(int32_t);
  DeviceId dev = device_for(e.ctx, e.rank);
  auto send = DevBuf::make(e.ctx, dev, bytes);
  auto recv = DevBuf::make(e.ctx, dev, bytes);
  HMC_EXPECT(send.ok() && recv.ok(), "device allocation failed");
  // The device buffer starts with stale values; the real input arrives by a stream copy.
  // Host ends of stream copies are pinned: CUDA runs a copy to pageable memory on the
  // calling thread, which would block it until the collective finished.
  std::vector<int32_t> stale(count, -1000);
  auto pinned_in = e.ctx.alloc(dev, bytes, AllocKind::kPinnedHost);
  auto pinned_out = e.ctx.alloc(dev, bytes, AllocKind::kPinnedHost);
  HMC_EXPECT(pinned_in.ok() && pinned_out.ok(), "pinned host allocation failed");
  auto* input = static_cast<int32_t*>(pinned_in->data());
  auto* result = static_cast<int32_t*>(pinned_out->data());
  for (std::size_t i = 0; i < count; ++i) input[i] = static_cast<int32_t>(i % 1000) + e.rank;
  std::memset(result, 0, bytes);
  std::memcpy(send->host.data(), stale.data(), bytes);
  HMC_EXPECT_OK(send->push());
  auto stream = Stream::create(e.ctx, dev);
  HMC_EXPECT(stream.ok(), stream.status().to_string());
  HMC_EXPECT_OK(stream->copy(send->ptr(), input, bytes));
  CollOptions opt;
  opt.stream = stream->native();
  Request r = all_reduce(e.comm, send->ptr(), recv->ptr(), count, DataType::kInt32, ReduceOp::kSum, opt);
  HMC_EXPECT_OK(stream->copy(result, recv->ptr(), bytes));
  HMC_EXPECT_OK(stream->synchronize(std::chrono::milliseconds(30000)));
  // The stream passed the collective: it has completed, and the result is the new input's.
  HMC_EXPECT(r.test(), "the stream ran past a collective that had not completed");
  HMC_EXPECT_OK(r.status());
  for (std::size_t i = 0; i < count; ++i) {
    int32_t want = 0;
    for (int q = 0; q < e.size; ++q) want += static_cast<int32_t>(i % 1000) + q;
    HMC_EXPECT(result[i] == want, "element " + std::to_string(i) + ": got " + std::to_string(result[i]) + " want " +
                                      std::to_string(want));
  }
  return 0;
}

int32_t* as_i32(DevBuf& b) { return reinterpret_cast<int32_t*>(b.host.data()); }

// Three stream-ordered calls back to back on one stream, checked once the stream is idle:
// a group around the ring, an in-place all_gather, and an all_to_all_v whose receive
// buffer has gaps between the blocks, which must keep their contents.
int ordered_layouts(RankEnv& e) {
  const int n = e.size, r = e.rank;
  constexpr std::size_t kN = 4096, kGap = 3;
  DeviceId dev = device_for(e.ctx, r);
  auto stream = Stream::create(e.ctx, dev);
  HMC_EXPECT(stream.ok(), stream.status().to_string());
  CollOptions opt;
  opt.stream = stream->native();
  auto gs = DevBuf::make(e.ctx, dev, kN * 4), gr = DevBuf::make(e.ctx, dev, kN * 4);
  auto ag = DevBuf::make(e.ctx, dev, n * kN * 4);
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::size_t sent = 0, got = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = j + 1 + r, sd[j] = sent, sent += sc[j];  // rank r sends j+1+r elements to j
    rc[j] = r + 1 + j, rd[j] = got, got += rc[j] + kGap;
  }
  auto vs = DevBuf::make(e.ctx, dev, sent * 4), vr = DevBuf::make(e.ctx, dev, got * 4);
  HMC_EXPECT(gs.ok() && gr.ok() && ag.ok() && vs.ok() && vr.ok(), "device allocation failed");
  for (std::size_t i = 0; i < kN; ++i) as_i32(*gs)[i] = r * 100000 + static_cast<int32_t>(i), as_i32(*gr)[i] = -1;
  for (std::size_t i = 0; i < n * kN; ++i)
    as_i32(*ag)[i] = i / kN == static_cast<std::size_t>(r) ? r * 7 + static_cast<int32_t>(i % kN) : -1;
  for (int j = 0; j < n; ++j)
    for (std::size_t k = 0; k < sc[j]; ++k) as_i32(*vs)[sd[j] + k] = r * 1000 + j * 100 + static_cast<int32_t>(k);
  std::fill(as_i32(*vr), as_i32(*vr) + got, -7);
  for (auto* b : {&*gs, &*gr, &*ag, &*vs, &*vr}) HMC_EXPECT_OK(b->push());
  Group g(e.comm);
  g.send(gs->ptr(), kN, DataType::kInt32, (r + 1) % n).recv(gr->ptr(), kN, DataType::kInt32, (r + n - 1) % n);
  Request reqs[] = {
      g.end(opt),
      all_gather(e.comm, static_cast<int32_t*>(ag->ptr()) + r * kN, ag->ptr(), kN, DataType::kInt32, opt),
      all_to_all_v(e.comm, vs->ptr(), sc, sd, vr->ptr(), rc, rd, DataType::kInt32, opt)};
  HMC_EXPECT_OK(stream->synchronize(std::chrono::milliseconds(30000)));
  for (auto& q : reqs) {
    HMC_EXPECT(q.test(), "the stream ran past a call that had not completed");
    HMC_EXPECT_OK(q.status());
  }
  for (auto* b : {&*gr, &*ag, &*vr}) HMC_EXPECT_OK(b->pull());
  const int left = (r + n - 1) % n;
  for (std::size_t i = 0; i < kN; ++i)
    HMC_EXPECT(as_i32(*gr)[i] == left * 100000 + static_cast<int32_t>(i), "group element " + std::to_string(i));
  for (std::size_t i = 0; i < n * kN; ++i)
    HMC_EXPECT(as_i32(*ag)[i] == static_cast<int32_t>(i / kN) * 7 + static_cast<int32_t>(i % kN),
               "all_gather element " + std::to_string(i));
  for (int j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < rc[j]; ++k)
      HMC_EXPECT(as_i32(*vr)[rd[j] + k] == j * 1000 + r * 100 + static_cast<int32_t>(k),
                 "all_to_all_v block " + std::to_string(j) + " element " + std::to_string(k));
    for (std::size_t k = 0; k < kGap; ++k)
      HMC_EXPECT(as_i32(*vr)[rd[j] + rc[j] + k] == -7, "all_to_all_v gap after block " + std::to_string(j));
  }
  return 0;
}

// hmc::Stream: copies run in the order queued, idle() and synchronize() follow them, and
// what it cannot do is refused clearly. On the emulator every operation takes
// HMC_EMU_STREAM_DELAY_US, so the stream is still busy right after the calls.
int stream_handle(RankEnv& e) {
  constexpr std::size_t kN = 1 << 16, kBytes = kN * sizeof(int32_t);
  const DeviceId dev = device_for(e.ctx, e.rank);
  auto dbuf = e.ctx.alloc(dev, kBytes);
  auto in = e.ctx.alloc(dev, kBytes, AllocKind::kPinnedHost), out = e.ctx.alloc(dev, kBytes, AllocKind::kPinnedHost);
  HMC_EXPECT(dbuf.ok() && in.ok() && out.ok(), "allocation failed");
  auto* src = static_cast<int32_t*>(in->data());
  auto* dst = static_cast<int32_t*>(out->data());
  for (std::size_t i = 0; i < kN; ++i) src[i] = static_cast<int32_t>(i * 3 + 1), dst[i] = -1;
  auto made = Stream::create(e.ctx, dev);
  HMC_EXPECT(made.ok(), made.status().to_string());
  Stream stream = std::move(made.value());
  HMC_EXPECT(made->native() == nullptr && stream.native() != nullptr && stream.device() == dev, "move");
  HMC_EXPECT_OK(stream.copy(dbuf->data(), src, kBytes));
  HMC_EXPECT_OK(stream.copy(dst, dbuf->data(), kBytes));
  if (device_under_test() == "emu") {
    auto idle = stream.idle();
    HMC_EXPECT(idle.ok() && !idle.value(), "idle while two delayed copies are queued");
    Status early = stream.synchronize(std::chrono::milliseconds(1));
    HMC_EXPECT(early.code() == ErrorCode::kTimeout, early.to_string());
  }
  HMC_EXPECT_OK(stream.synchronize());
  auto idle = stream.idle();
  HMC_EXPECT(idle.ok() && idle.value(), "not idle after synchronize");
  for (std::size_t i = 0; i < kN; ++i)
    HMC_EXPECT(dst[i] == static_cast<int32_t>(i * 3 + 1), "element " + std::to_string(i) + ": " + std::to_string(dst[i]));

  HMC_EXPECT(Stream::create(e.ctx, {"cpu", 0}).status().code() == ErrorCode::kUnsupported, "a cpu stream");
  HMC_EXPECT(Stream::create(e.ctx, {"nosuch", 0}).status().code() == ErrorCode::kUnavailable, "an unknown provider");
  HMC_EXPECT(stream.copy(nullptr, src, kBytes).code() == ErrorCode::kInvalidArgument, "a null destination");
  Stream empty;
  HMC_EXPECT(empty.copy(dst, src, kBytes).code() == ErrorCode::kInvalidArgument, "a copy on an empty Stream");
  HMC_EXPECT(!empty.idle().ok() && empty.synchronize().code() == ErrorCode::kInvalidArgument, "an empty Stream");
  return 0;
}

// kCalls all_reduces queued back to back on one stream, each on its own buffers, checked
// once the stream is idle. With the emulator's delay every call is still in flight when
// the next is made, so each would take a staging block of its own without
// HMC_STREAM_STAGE_MAX.
int queued_all_reduces(RankEnv& e, int calls, std::size_t count) {
  const std::size_t bytes = count * sizeof(int32_t);
  const DeviceId dev = device_for(e.ctx, e.rank);
  auto stream = Stream::create(e.ctx, dev);
  HMC_EXPECT(stream.ok(), stream.status().to_string());
  CollOptions opt;
  opt.stream = stream->native();
  std::vector<DevBuf> send, recv;
  std::vector<Request> reqs;
  for (int k = 0; k < calls; ++k) {
    auto s = DevBuf::make(e.ctx, dev, bytes), r = DevBuf::make(e.ctx, dev, bytes);
    HMC_EXPECT(s.ok() && r.ok(), "device allocation failed");
    for (std::size_t i = 0; i < count; ++i) as_i32(*s)[i] = static_cast<int32_t>(i % 977) + k * 10 + e.rank;
    HMC_EXPECT_OK(s->push());
    send.push_back(std::move(s.value()));
    recv.push_back(std::move(r.value()));
  }
  for (int k = 0; k < calls; ++k)
    reqs.push_back(all_reduce(e.comm, send[k].ptr(), recv[k].ptr(), count, DataType::kInt32, ReduceOp::kSum, opt));
  HMC_EXPECT_OK(stream->synchronize());
  for (int k = 0; k < calls; ++k) {
    HMC_EXPECT(reqs[k].test(), "the stream ran past call " + std::to_string(k));
    HMC_EXPECT_OK(reqs[k].status());
    HMC_EXPECT_OK(recv[k].pull());
    for (std::size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int q = 0; q < e.size; ++q) want += static_cast<int32_t>(i % 977) + k * 10 + q;
      HMC_EXPECT(as_i32(recv[k])[i] == want, "call " + std::to_string(k) + " element " + std::to_string(i));
    }
  }
  return 0;
}

// In-place all_reduces of growing size on one stream, each finished (stream synchronized)
// before the next: a sweep as hmc-bench --stream makes. Every block the pool kept fits
// none of the later calls.
int growing_all_reduces(RankEnv& e, const std::vector<std::size_t>& counts) {
  const DeviceId dev = device_for(e.ctx, e.rank);
  auto stream = Stream::create(e.ctx, dev);
  HMC_EXPECT(stream.ok(), stream.status().to_string());
  CollOptions opt;
  opt.stream = stream->native();
  for (std::size_t count : counts) {
    auto buf = DevBuf::make(e.ctx, dev, count * sizeof(int32_t));
    HMC_EXPECT(buf.ok(), "device allocation failed");
    for (std::size_t i = 0; i < count; ++i) as_i32(*buf)[i] = static_cast<int32_t>(i % 613) + e.rank;
    HMC_EXPECT_OK(buf->push());
    Request r = all_reduce(e.comm, buf->ptr(), buf->ptr(), count, DataType::kInt32, ReduceOp::kSum, opt);
    HMC_EXPECT_OK(stream->synchronize());
    HMC_EXPECT_OK(r.wait(kWait));
    HMC_EXPECT_OK(buf->pull());
    for (std::size_t i = 0; i < count; ++i) {
      const int32_t want = e.size * static_cast<int32_t>(i % 613) + e.size * (e.size - 1) / 2;
      HMC_EXPECT(as_i32(*buf)[i] == want, "count " + std::to_string(count) + " element " + std::to_string(i));
    }
  }
  return 0;
}

// Rank 0 queues a stream-ordered all_reduce that rank 1 joins only after it received
// `messages` rendezvous sends from rank 0, each into a device allocation of its own: rank 0
// imports each by IPC while its stream waits on the all_reduce's flag, and closes imports
// past its cache's size. Closing one waits for the whole device (cudaIpcCloseMemHandle),
// which would not return before that flag is set.
// With `grow`, message k is bytes << k long: each needs a larger staging buffer.
int imports_while_stream_waits(RankEnv& e, int messages, std::size_t bytes, bool grow = false) {
  auto size = [&](int k) { return grow ? bytes << k : bytes; };
  const DeviceId dev = device_for(e.ctx, e.rank);
  auto stream = Stream::create(e.ctx, dev);
  auto acc = DevBuf::make(e.ctx, dev, 1024 * sizeof(int32_t));
  HMC_EXPECT(stream.ok() && acc.ok(), "setup");
  acc->host.resize(1024 * sizeof(int32_t));
  for (int i = 0; i < 1024; ++i) as_i32(*acc)[i] = i + e.rank;
  HMC_EXPECT_OK(acc->push());
  CollOptions opt;
  opt.stream = stream->native();
  auto reduce = [&] { return all_reduce(e.comm, acc->ptr(), acc->ptr(), 1024, DataType::kInt32, ReduceOp::kSum, opt); };
  Request r;
  if (e.rank == 0) {
    r = reduce();
    auto src = DevBuf::make(e.ctx, dev, size(messages - 1));
    HMC_EXPECT(src.ok(), "setup");
    for (int k = 0; k < messages; ++k) {
      src->host = random_bytes(size(k), 500 + k);
      HMC_EXPECT_OK(src->push());
      HMC_EXPECT_OK(e.comm.isend(src->ptr(), size(k), 1, k).wait(kWait));
    }
  } else if (e.rank == 1) {
    std::vector<DevBuf> dst;
    for (int k = 0; k < messages; ++k) {
      auto b = DevBuf::make(e.ctx, dev, size(k));
      HMC_EXPECT(b.ok(), "device allocation " + std::to_string(k));
      HMC_EXPECT_OK(e.comm.irecv(b->ptr(), size(k), 0, k).wait(kWait));
      HMC_EXPECT_OK(b->pull());
      HMC_EXPECT(b->host == random_bytes(size(k), 500 + k), "message " + std::to_string(k));
      dst.push_back(std::move(b.value()));
    }
    r = reduce();
  }
  HMC_EXPECT_OK(stream->synchronize());
  HMC_EXPECT_OK(r.wait(kWait));
  HMC_EXPECT_OK(acc->pull());
  for (int i = 0; i < 1024; ++i) HMC_EXPECT(as_i32(*acc)[i] == 2 * i + 1, "element " + std::to_string(i));
  return 0;
}

// Whether stream-ordered calls stage through host memory in this run (ctest's
// device.emu.unstaged sets HMC_STREAM_STAGE=0).
bool staging_on() {
  const char* v = std::getenv("HMC_STREAM_STAGE");
  return !(v && std::string(v) == "0");
}

// Bytes of host memory registered, summed from an HMC_EMU_REGISTER_LOG file.
std::size_t registered_bytes(const std::string& log) {
  std::ifstream in(log);
  std::string what;
  std::size_t n = 0, total = 0;
  while (in >> what >> n)
    if (what == "register") total += n;
  return total;
}

// The lines of an HMC_EMU_REGISTER_LOG file that start with `prefix`, joined; the file
// is removed.
std::string take_lines(const std::string& log, const std::string& prefix) {
  std::ifstream in(log);
  std::string line, found;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) found += line + "; ";
  std::remove(log.c_str());
  return found;
}

// The most host memory registered at once, from the same file (all ranks together).
std::size_t peak_registered(const std::string& log) {
  std::ifstream in(log);
  std::string what;
  std::size_t n = 0, now = 0, peak = 0;
  while (in >> what >> n) {
    if (what == "register") now += n;
    if (what == "unregister") now -= std::min(now, n);
    peak = std::max(peak, now);
  }
  return peak;
}

}  // namespace

TEST_CASE("stream-ordered group, in-place all_gather and all_to_all_v keep every layout", "[device][stream]") {
  auto exits = run_ranks(3, {}, [](RankEnv& e) { return ordered_layouts(e); }, kWait);
  INFO(describe(exits));
  REQUIRE(all_ok(exits));
}

TEST_CASE("stream-ordered all_reduce waits for earlier stream work and holds later work", "[device][stream]") {
  // The emulator also notes the streams, events and flags still alive at its fini: the
  // context must have freed every one it made for the ordering.
  const std::string log = "/tmp/hmc-stream-left-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  for (std::size_t count : {std::size_t{1000}, std::size_t{1} << 20}) {
    auto exits = run_ranks(2, {{"HMC_EMU_STREAM_DELAY_US", "100000"}, {"HMC_EMU_REGISTER_LOG", log}},
                           [&](RankEnv& e) { return ordered_all_reduce(e, count); }, kWait);
    INFO(describe(exits));
    REQUIRE(all_ok(exits));
  }
  CHECK(take_lines(log, "left-").empty());
}

TEST_CASE("hmc::Stream copies in order, waits and refuses what it cannot do", "[device][stream]") {
  auto exits = run_ranks(1, {{"HMC_EMU_STREAM_DELAY_US", "50000"}}, [](RankEnv& e) { return stream_handle(e); }, kWait);
  INFO(describe(exits));
  REQUIRE(all_ok(exits));
}

TEST_CASE("a stream on host memory is refused clearly", "[device][stream]") {
  auto exits = run_ranks(2, {}, [](RankEnv& e) {
    std::vector<float> v(16, 1.0f);
    CollOptions opt;
    opt.stream = reinterpret_cast<void*>(0x1);
    Status s = all_reduce(e.comm, v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, opt).wait(kWait);
    HMC_EXPECT(s.code() == ErrorCode::kUnsupported, s.to_string());
    HMC_EXPECT(s.message().find("stream") != std::string::npos, s.message());
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
}

TEST_CASE("queued stream-ordered calls stay within HMC_STREAM_STAGE_MAX of host staging", "[device][stream]") {
  if (device_under_test() != "emu" || !staging_on()) {
    WARN("needs the emulated provider's registration log and staging: skipped");
    return;
  }
  // 8 calls of 256 KiB in and out: a 512 KiB staging block each. Within 1 MiB a rank has
  // two; unbounded, up to eight.
  const std::string log = "/tmp/hmc-stage-max-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  auto exits = run_ranks(2, {{"HMC_EMU_STREAM_DELAY_US", "20000"}, {"HMC_EMU_REGISTER_LOG", log},
                             {"HMC_STREAM_STAGE_MAX", "1M"}},
                         [](RankEnv& e) { return queued_all_reduces(e, 8, 64 * 1024); }, kWait);
  INFO(describe(exits));
  REQUIRE(all_ok(exits));
  const std::size_t registered = registered_bytes(log);
  std::remove(log.c_str());
  CHECK(registered >= 2 * 512 * 1024);
  CHECK(registered <= 2 * 1024 * 1024);
}

TEST_CASE("a sweep of growing stream-ordered calls keeps its staging within HMC_STREAM_STAGE_MAX",
          "[device][stream]") {
  if (device_under_test() != "emu" || !staging_on()) {
    WARN("needs the emulated provider's registration log and staging: skipped");
    return;
  }
  // Blocks of 128, 256, 512 and 768 KiB, one call at a time: kept, they would hold 1664 KiB
  // a rank; within 1 MiB the pool lets go of kept blocks that fit no call.
  const std::string log = "/tmp/hmc-stage-sweep-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  const std::vector<std::size_t> counts{32 << 10, 64 << 10, 128 << 10, 192 << 10};
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}, {"HMC_STREAM_STAGE_MAX", "1M"}},
                         [&](RankEnv& e) { return growing_all_reduces(e, counts); }, kWait);
  INFO(describe(exits));
  REQUIRE(all_ok(exits));
  const std::size_t peak = peak_registered(log), total = registered_bytes(log);
  std::remove(log.c_str());
  INFO("registered " << total << " bytes in all, at most " << peak << " at once (2 ranks)");
  CHECK(total >= 2 * std::size_t{1664} * 1024);  // every call staged
  CHECK(peak <= 2 * (std::size_t{1} << 20));
}

// Runs imports_while_stream_waits(messages, bytes, grow) on two ranks, with `env`, where the
// emulator's frees and closes wait for every stream as CUDA's do and note it when one would
// have waited forever: none may. Emulator only, each stream in a queue of its own: the
// copies are device work queued after the flag wait, which a shared hardware queue
// (CUDA's included) would hold behind it for good.
void check_no_device_wide_wait(std::map<std::string, std::string> env, int messages, std::size_t bytes, bool grow) {
  const char* queues = std::getenv("HMC_EMU_QUEUES");
  if (device_under_test() != "emu" || (queues && std::string(queues) != "0")) {
    WARN("needs the emulated provider with a queue per stream: skipped");
    return;
  }
  const std::string log = "/tmp/hmc-wide-waits-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  env["HMC_EMU_DEVICE_WIDE_FREES"] = "1";
  env["HMC_EMU_REGISTER_LOG"] = log;
  auto exits = run_ranks(2, env, [&](RankEnv& e) { return imports_while_stream_waits(e, messages, bytes, grow); }, kWait);
  INFO(describe(exits));
  const std::string stuck = take_lines(log, "device-wide-wait-stuck");
  REQUIRE(all_ok(exits));
  CHECK(stuck.empty());
}

TEST_CASE("IPC imports are not closed while a stream waits on a flag", "[device][ipc]") {
  // 70 imports: past the cache's 64, so six would be closed while rank 0's stream waits.
  check_no_device_wide_wait({}, 70, 256 * 1024, false);
}

TEST_CASE("staging buffers are not freed while a stream waits on a flag", "[device][stream]") {
  // Ranks on two "hosts": device messages go through pinned staging buffers, of which a
  // communicator keeps 8. Ten messages, each twice the last, would free idle ones while
  // rank 0's stream waits; freeing pinned memory waits for the whole device (as
  // cudaFreeHost does).
  check_no_device_wide_wait({{"HMC_HOST_ID", "host{rank}"}}, 10, 64 * 1024, true);
}

TEST_CASE("a stream-ordered call that cannot get staging within HMC_TIMEOUT fails clearly", "[device][stream]") {
  if (device_under_test() != "emu" || !staging_on()) {
    WARN("needs the emulated provider's slow streams and staging: skipped");
    return;
  }
  // Each stream operation takes 3 s: the first call holds the only block HMC_STREAM_STAGE_MAX
  // allows past the second call's 2 s deadline (which bounds set-up too: not less on a
  // loaded machine).
  auto exits = run_ranks(2, {{"HMC_EMU_STREAM_DELAY_US", "3000000"}, {"HMC_STREAM_STAGE_MAX", "64K"},
                             {"HMC_TIMEOUT", "2s"}}, [](RankEnv& e) {
    const DeviceId dev = device_for(e.ctx, e.rank);
    auto a = DevBuf::make(e.ctx, dev, 4096), b = DevBuf::make(e.ctx, dev, 4096);
    auto stream = Stream::create(e.ctx, dev);
    HMC_EXPECT(a.ok() && b.ok() && stream.ok(), "setup");
    CollOptions opt;
    opt.stream = stream->native();
    Request first = all_reduce(e.comm, a->ptr(), a->ptr(), 1024, DataType::kInt32, ReduceOp::kSum, opt);
    Request second = all_reduce(e.comm, b->ptr(), b->ptr(), 1024, DataType::kInt32, ReduceOp::kSum, opt);
    Status s = second.wait(kWait);
    HMC_EXPECT(s.code() == ErrorCode::kTimeout, s.to_string());
    HMC_EXPECT(s.message().find("HMC_STREAM_STAGE_MAX") != std::string::npos, s.message());
    (void)first.wait(kWait);  // times out too: its stream has not reached it
    return 0;
  }, kWait);
  INFO(describe(exits));
  REQUIRE(all_ok(exits));
}
