// Streams of the emulated device: asynchronous and in order (shown with a per-operation
// delay), stream_wait_flag and events hold work back, streams sharing a hardware queue
// (HMC_EMU_QUEUES) hold each other back, destroy ends a blocked stream, and foreign
// handles are refused; with HMC_EMU_DEVICE_WIDE_FREES frees wait for queued stream work.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "emu_session.h"

using namespace hmc::emu_test;
using namespace std::chrono_literals;

namespace {

constexpr size_t kBytes = 256 << 10;

struct Fixture {
  Plugin emu{HMC_EMU_PLUGIN, {{"HMC_EMU_STREAM_DELAY_US", "20000"}}};
  std::vector<void*> streams;

  void* stream(int device = 0) {
    void* s = nullptr;
    REQUIRE(emu.p->stream_create(emu.state, device, &s) == 0);
    streams.push_back(s);
    return s;
  }
  ~Fixture() {
    for (void* s : streams) emu.p->stream_destroy(emu.state, s);
  }
  void set_flag(volatile uint32_t* flag, uint32_t v) { __atomic_store_n(flag, v, __ATOMIC_RELEASE); }
};

// The result of a provider call running on a thread of its own, within 10 s. A call still
// stuck then cannot be abandoned (its future would block in its destructor, and the thread
// uses this test's stack), so the process ends at once with the failure instead of
// waiting for ctest's timeout.
int result_within_10s(std::future<int>& call, const char* what) {
  if (call.wait_for(10s) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not return within 10 s\n", what);
    std::fflush(nullptr);
    std::_Exit(EXIT_FAILURE);
  }
  return call.get();
}

}  // namespace

TEST_CASE("stream work is asynchronous and runs in order", "[emu][streams]") {
  Fixture f;
  REQUIRE(f.emu.init_rc == HMC_PROV_OK);
  auto& emu = f.emu;
  void* s = f.stream(1);
  void* dev = emu.alloc(1, kBytes);
  const auto src = random_bytes(kBytes, 7);
  std::vector<uint8_t> dst(kBytes, 0xa5);
  // Ten writes of different data to one place, then the read: only the last may show.
  std::vector<std::vector<uint8_t>> versions;
  for (int i = 0; i < 10; ++i) versions.push_back(random_bytes(kBytes, 100 + i));
  for (const auto& v : versions) REQUIRE(emu.p->copy(emu.state, dev, v.data(), kBytes, s) == 0);
  REQUIRE(emu.p->copy(emu.state, dst.data(), dev, kBytes, s) == 0);
  CHECK(emu.p->stream_query(emu.state, s) == HMC_PROV_IN_PROGRESS);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t c) { return c == 0xa5; }));
  CHECK(emu.wait(emu.p->stream_query, s) == HMC_PROV_OK);
  CHECK(dst == versions.back());
  // Reduce and divide on the stream, after a copy that feeds them.
  std::vector<int32_t> ones(1000, 6), out(1000, -1);
  REQUIRE(emu.p->copy(emu.state, dev, ones.data(), 4000, s) == 0);
  REQUIRE(emu.p->reduce(emu.state, dev, dev, dev, 1000, HMC_DTYPE_INT32, HMC_OP_SUM, s) == 0);
  REQUIRE(emu.p->divide(emu.state, dev, 1000, HMC_DTYPE_INT32, 4, s) == 0);
  REQUIRE(emu.p->copy(emu.state, out.data(), dev, 4000, s) == 0);
  CHECK(emu.wait(emu.p->stream_query, s) == HMC_PROV_OK);
  CHECK(out == std::vector<int32_t>(1000, 3));
  emu.free(1, dev);
}

TEST_CASE("stream_wait_flag and events hold later work back", "[emu][streams][flags]") {
  Fixture f;
  REQUIRE(f.emu.init_rc == HMC_PROV_OK);
  auto& emu = f.emu;
  void* s1 = f.stream(0);
  void* s2 = f.stream(1);
  volatile uint32_t* flag = nullptr;
  REQUIRE(emu.p->flag_alloc(emu.state, 0, &flag) == 0);
  void* event = nullptr;
  REQUIRE(emu.p->event_create(emu.state, 0, &event) == 0);
  CHECK(emu.p->event_query(emu.state, event) == HMC_PROV_OK);  // never recorded: done
  void* dev = emu.alloc(0, kBytes);
  const auto src = random_bytes(kBytes, 8);
  std::vector<uint8_t> dst(kBytes, 0xa5);
  REQUIRE(emu.p->stream_wait_flag(emu.state, s1, flag, 2) == 0);
  REQUIRE(emu.p->copy(emu.state, dev, src.data(), kBytes, s1) == 0);
  REQUIRE(emu.p->event_record(emu.state, event, s1) == 0);
  REQUIRE(emu.p->stream_wait_event(emu.state, s2, event) == 0);
  REQUIRE(emu.p->copy(emu.state, dst.data(), dev, kBytes, s2) == 0);
  std::this_thread::sleep_for(150ms);  // several delays: anything not held back has run
  CHECK(emu.p->event_query(emu.state, event) == HMC_PROV_IN_PROGRESS);
  CHECK(emu.p->stream_query(emu.state, s1) == HMC_PROV_IN_PROGRESS);
  CHECK(emu.p->stream_query(emu.state, s2) == HMC_PROV_IN_PROGRESS);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t c) { return c == 0xa5; }));
  f.set_flag(flag, 1);  // not enough
  std::this_thread::sleep_for(100ms);
  CHECK(emu.p->stream_query(emu.state, s1) == HMC_PROV_IN_PROGRESS);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t c) { return c == 0xa5; }));
  f.set_flag(flag, 2);
  CHECK(emu.wait(emu.p->stream_query, s2) == HMC_PROV_OK);
  CHECK(emu.p->event_query(emu.state, event) == HMC_PROV_OK);
  CHECK(dst == src);
  // Only flag_alloc words are flags; the NULL stream waits on the caller.
  uint32_t not_a_flag = 5;
  CHECK(emu.p->stream_wait_flag(emu.state, s1, &not_a_flag, 1) == HMC_PROV_ERR_INVALID);
  CHECK(emu.p->stream_wait_flag(emu.state, nullptr, flag, 2) == 0);
  CHECK(emu.p->event_destroy(emu.state, event) == 0);
  CHECK(emu.p->flag_free(emu.state, flag) == 0);
  emu.free(0, dev);
}

TEST_CASE("destroying a stream blocked on a flag ends and drops its work", "[emu][streams][flags]") {
  Fixture f;
  REQUIRE(f.emu.init_rc == HMC_PROV_OK);
  auto& emu = f.emu;
  void* blocked = nullptr;
  REQUIRE(emu.p->stream_create(emu.state, 0, &blocked) == 0);
  void* waiter = f.stream(1);
  volatile uint32_t* flag = nullptr;
  REQUIRE(emu.p->flag_alloc(emu.state, 0, &flag) == 0);
  void* event = nullptr;
  REQUIRE(emu.p->event_create(emu.state, 0, &event) == 0);
  void* dev = emu.alloc(0, kBytes);
  emu.write(dev, std::vector<uint8_t>(kBytes, 0xa5));
  const auto src = random_bytes(kBytes, 9);
  REQUIRE(emu.p->stream_wait_flag(emu.state, blocked, flag, 1) == 0);
  REQUIRE(emu.p->copy(emu.state, dev, src.data(), kBytes, blocked) == 0);
  REQUIRE(emu.p->event_record(emu.state, event, blocked) == 0);
  REQUIRE(emu.p->stream_wait_event(emu.state, waiter, event) == 0);
  std::this_thread::sleep_for(50ms);
  auto destroyed = std::async(std::launch::async,
                              [&] { return emu.p->stream_destroy(emu.state, blocked); });
  CHECK(result_within_10s(destroyed, "stream_destroy of a stream blocked on a flag") == 0);
  CHECK(emu.read(dev, kBytes) == std::vector<uint8_t>(kBytes, 0xa5));  // the copy never ran
  CHECK(emu.p->event_query(emu.state, event) == HMC_PROV_ERR_CLOSED);
  CHECK(emu.wait(emu.p->stream_query, waiter) == HMC_PROV_ERR_CLOSED);  // its wait failed
  CHECK(emu.p->stream_query(emu.state, blocked) == HMC_PROV_ERR_INVALID);  // gone
  emu.p->event_destroy(emu.state, event);
  emu.p->flag_free(emu.state, flag);
  emu.free(0, dev);
}

TEST_CASE("streams that share a hardware queue wait behind each other's waits", "[emu][streams][flags]") {
  // HMC_EMU_QUEUES=1: every stream of a device, and synchronous work, in one queue.
  Plugin emu{HMC_EMU_PLUGIN, {{"HMC_EMU_QUEUES", "1"}}};
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  void* waiting = nullptr;
  void* other = nullptr;
  REQUIRE(emu.p->stream_create(emu.state, 0, &waiting) == 0);
  REQUIRE(emu.p->stream_create(emu.state, 0, &other) == 0);
  volatile uint32_t* flag = nullptr;
  REQUIRE(emu.p->flag_alloc(emu.state, 0, &flag) == 0);
  void* dev = emu.alloc(0, kBytes);
  emu.write(dev, std::vector<uint8_t>(kBytes, 0xa5));
  const auto src = random_bytes(kBytes, 11);
  REQUIRE(emu.p->stream_wait_flag(emu.state, waiting, flag, 1) == 0);
  // Another stream's copy, queued after the wait, does not run before the flag is set...
  REQUIRE(emu.p->copy(emu.state, dev, src.data(), kBytes, other) == 0);
  std::this_thread::sleep_for(100ms);
  CHECK(emu.p->stream_query(emu.state, other) == HMC_PROV_IN_PROGRESS);
  // ... nor does a synchronous copy of the device's memory.
  std::vector<uint8_t> back(kBytes, 0);
  auto sync_copy = std::async(std::launch::async, [&] { return emu.p->copy(emu.state, back.data(), dev, kBytes, nullptr); });
  CHECK(sync_copy.wait_for(100ms) == std::future_status::timeout);
  __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
  CHECK(emu.wait(emu.p->stream_query, other) == HMC_PROV_OK);
  CHECK(result_within_10s(sync_copy, "a synchronous copy after the queue's flag was set") == 0);
  CHECK(back == src);  // in queue order: the stream's copy first
  // Host-to-host copies take no queue. A stream destroyed while its wait holds the queue
  // ends, and the queue goes on.
  __atomic_store_n(flag, 0u, __ATOMIC_RELEASE);
  REQUIRE(emu.p->stream_wait_flag(emu.state, waiting, flag, 1) == 0);
  std::vector<uint8_t> a(64, 1), b(64, 0);
  CHECK(emu.p->copy(emu.state, b.data(), a.data(), 64, nullptr) == 0);
  CHECK(a == b);
  REQUIRE(emu.p->copy(emu.state, dev, a.data(), 64, other) == 0);
  std::this_thread::sleep_for(50ms);
  CHECK(emu.p->stream_query(emu.state, other) == HMC_PROV_IN_PROGRESS);
  CHECK(emu.p->stream_destroy(emu.state, waiting) == 0);
  CHECK(emu.wait(emu.p->stream_query, other) == HMC_PROV_OK);
  CHECK(emu.read(dev, 64) == a);
  CHECK(emu.p->stream_destroy(emu.state, other) == 0);
  emu.p->flag_free(emu.state, flag);
  emu.free(0, dev);
}

TEST_CASE("handles that are not the provider's are refused without a crash", "[emu][streams]") {
  Plugin emu(HMC_EMU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  int not_a_stream = 42;
  void* bogus = &not_a_stream;
  void* wild = reinterpret_cast<void*>(0x10);
  std::vector<uint8_t> a(64), b(64);
  volatile uint32_t* flag = nullptr;
  REQUIRE(emu.p->flag_alloc(emu.state, 0, &flag) == 0);
  for (void* h : {bogus, wild}) {
    CHECK(emu.p->copy(emu.state, a.data(), b.data(), 64, h) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->stream_query(emu.state, h) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->stream_destroy(emu.state, h) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->event_query(emu.state, h) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->event_destroy(emu.state, h) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->stream_wait_flag(emu.state, h, flag, 0) == HMC_PROV_ERR_INVALID);
    CHECK(emu.p->reduce(emu.state, a.data(), a.data(), b.data(), 16, HMC_DTYPE_FP32, HMC_OP_SUM, h) ==
          HMC_PROV_ERR_INVALID);
    CHECK_FALSE(emu.error().empty());
  }
  CHECK(emu.p->flag_free(emu.state, flag) == 0);
  CHECK(emu.p->flag_free(emu.state, flag) == HMC_PROV_ERR_INVALID);
  void* s = nullptr;
  REQUIRE(emu.p->stream_create(emu.state, 0, &s) == 0);
  void* e = nullptr;
  REQUIRE(emu.p->event_create(emu.state, 0, &e) == 0);
  CHECK(emu.p->event_record(emu.state, s, e) == HMC_PROV_ERR_INVALID);  // swapped
  CHECK(emu.p->stream_destroy(emu.state, s) == 0);
  CHECK(emu.p->stream_destroy(emu.state, s) == HMC_PROV_ERR_INVALID);  // twice
  CHECK(emu.p->event_destroy(emu.state, e) == 0);
  CHECK(emu.p->stream_create(emu.state, 2, &s) == HMC_PROV_ERR_INVALID);
}

TEST_CASE("with HMC_EMU_DEVICE_WIDE_FREES a free waits for queued stream work, and gives up",
          "[emu][streams][flags]") {
  // As cudaFree and cudaHostUnregister wait for the device; after 5 s it fails and notes it.
  const std::string log = "/tmp/hmc-emu-wide-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  Plugin emu{HMC_EMU_PLUGIN, {{"HMC_EMU_DEVICE_WIDE_FREES", "1"}, {"HMC_EMU_REGISTER_LOG", log}}};
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  void* stream = nullptr;
  REQUIRE(emu.p->stream_create(emu.state, 0, &stream) == 0);
  volatile uint32_t* flag = nullptr;
  REQUIRE(emu.p->flag_alloc(emu.state, 0, &flag) == 0);
  void* a = emu.alloc(0, kBytes);
  void* b = emu.alloc(1, kBytes);  // on the other device: the emulator waits for every stream
  REQUIRE(emu.p->stream_wait_flag(emu.state, stream, flag, 1) == 0);
  auto freed = std::async(std::launch::async, [&] { return emu.p->mem_free(emu.state, 0, a); });
  CHECK(freed.wait_for(200ms) == std::future_status::timeout);
  __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
  CHECK(result_within_10s(freed, "mem_free after the flag was set") == 0);
  // A wait nobody will end: the free fails after 5 s instead of hanging, and says so.
  REQUIRE(emu.p->stream_wait_flag(emu.state, stream, flag, 2) == 0);
  auto stuck = std::async(std::launch::async, [&] { return emu.p->mem_free(emu.state, 1, b); });
  CHECK(result_within_10s(stuck, "mem_free behind a wait nobody ends") == HMC_PROV_ERR_INTERNAL);
  __atomic_store_n(flag, 2u, __ATOMIC_RELEASE);
  CHECK(emu.wait(emu.p->stream_query, stream) == HMC_PROV_OK);
  emu.free(1, b);
  CHECK(emu.p->stream_destroy(emu.state, stream) == 0);
  CHECK(emu.p->flag_free(emu.state, flag) == 0);
  std::ifstream in(log);
  std::string what;
  std::size_t n = 0, stuck_notes = 0;
  while (in >> what >> n) stuck_notes += what == "device-wide-wait-stuck";
  std::remove(log.c_str());
  CHECK(stuck_notes == 1);
}
