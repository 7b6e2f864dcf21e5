// Stream-ordered collectives (CollOptions::stream): the collective starts after the work
// queued on the stream before the call and work queued after it waits for it, while the
// calling thread returns at once. With the emulated provider's per-operation delay
// (HMC_EMU_STREAM_DELAY_US) a collective that started early would read the old input.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
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
  auto stream = DeviceStream::create(e.ctx, dev);
  HMC_EXPECT(stream.ok(), stream.status().to_string());
  HMC_EXPECT_OK(stream->copy_async(send->ptr(), input, bytes));
  CollOptions opt;
  opt.stream = stream->stream;
  Request r = all_reduce(e.comm, send->ptr(), recv->ptr(), count, DataType::kInt32, ReduceOp::kSum, opt);
  HMC_EXPECT_OK(stream->copy_async(result, recv->ptr(), bytes));
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

}  // namespace

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
  std::ifstream in(log);
  std::string line, left;
  while (std::getline(in, line))
    if (line.rfind("left-", 0) == 0) left += line + "; ";
  std::remove(log.c_str());
  CHECK(left.empty());
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
