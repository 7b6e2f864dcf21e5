// Point-to-point with device buffers, in real processes: IPC between device memories of
// one host, host staging where IPC cannot work (ranks that look like two hosts), device
// to plain and to shareable host memory, eager and rendezvous sizes, unexpected messages.
// Every byte is checked after a round trip through Context::copy.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "device_support.h"

using namespace hmc;
using namespace hmc::test;

namespace {

constexpr auto kWait = std::chrono::seconds(60);
const std::size_t kSizes[] = {1, 4096, 64 * 1024 + 3, 1 << 20, 6 * (1 << 20) + 5};

// Where each side of a transfer keeps its buffer.
enum class Side { kDevice, kPlainHost, kShareableHost, kForeignDevice };

Result<DevBuf> buffer(Context& ctx, int rank, Side side, std::size_t bytes) {
  switch (side) {
    case Side::kDevice: return DevBuf::make(ctx, device_for(ctx, rank), bytes);
    case Side::kPlainHost: return DevBuf::make(ctx, {"cpu", 0}, bytes);
    case Side::kShareableHost: return DevBuf::make(ctx, {"cpu", 0}, bytes, AllocKind::kShareable);
    case Side::kForeignDevice: return DevBuf::make_foreign(ctx, device_for(ctx, rank), bytes);
  }
  return Status(ErrorCode::kInvalidArgument, "side");
}

// Rank 0 sends every size from a `from` buffer, rank 1 receives into a `to` buffer; then
// the other way round. With `late_recv` the receiver posts after the message arrived.
int exchange(RankEnv& e, Side from, Side to, bool late_recv) {
  for (int round = 0; round < 2; ++round) {
    const int sender = round, receiver = 1 - round;
    for (std::size_t n : kSizes) {
      const uint64_t seed = n * 7 + round;
      if (e.rank == sender) {
        auto b = buffer(e.ctx, e.rank, from, n);
        HMC_EXPECT(b.ok(), b.status().to_string());
        b->host = random_bytes(n, seed);
        HMC_EXPECT_OK(b->push());
        HMC_EXPECT_OK(e.comm.send(b->ptr(), n, receiver, seed));
      } else if (e.rank == receiver) {
        auto b = buffer(e.ctx, e.rank, to, n);
        HMC_EXPECT(b.ok(), b.status().to_string());
        b->host.assign(n, 0xEE);
        HMC_EXPECT_OK(b->push());
        if (late_recv) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        Status s = e.comm.irecv(b->ptr(), n, sender, seed).wait(kWait);
        HMC_EXPECT(s.ok(), "receive of " + std::to_string(n) + " bytes: " + s.to_string());
        HMC_EXPECT_OK(b->pull());
        HMC_EXPECT(b->host == random_bytes(n, seed), "wrong bytes after a transfer of " + std::to_string(n));
      }
    }
  }
  return 0;
}

void run_exchange(const std::map<std::string, std::string>& settings, Side from, Side to, bool late = false) {
  auto exits = run_ranks(2, settings, [&](RankEnv& e) { return exchange(e, from, to, late); }, kWait);
  REQUIRE(all_ok(exits));
  INFO(describe(exits));
}

}  // namespace

TEST_CASE("device to device on one host (IPC)", "[device][p2p]") {
  run_exchange({}, Side::kDevice, Side::kDevice);
  run_exchange({}, Side::kDevice, Side::kDevice, true);
}

TEST_CASE("device to device staged through host memory (ranks on two 'hosts')", "[device][p2p]") {
  // Distinct host ids rule IPC and shm out: tcp carries staged copies.
  run_exchange({{"HMC_HOST_ID", "host-{rank}"}}, Side::kDevice, Side::kDevice);
}

// A staged send puts each chunk once its copy to pinned memory ends, and the receive ends
// on the FIN: the FIN must follow every chunk, whatever order the copies are seen to end
// in. Each event is queried at its own moment; a host preempted between two queries (the
// emulator's query lag) saw a later chunk's copy end before an earlier one's, and the FIN
// went out ahead of that chunk: under load the receive then ended without its bytes.
TEST_CASE("a staged send's FIN follows every chunk however late their copies are seen", "[device][p2p]") {
  if (device_under_test() != "emu") {
    WARN("needs the emulator's query lag: skipped for " << device_under_test());
    return;
  }
  run_exchange({{"HMC_HOST_ID", "host-{rank}"}, {"HMC_STAGE_CHUNK", "1M"}, {"HMC_EMU_STREAM_DELAY_US", "1000"},
                {"HMC_EMU_QUERY_LAG_US", "10000"}},
               Side::kDevice, Side::kPlainHost);
}

TEST_CASE("staged device transfers in chunks, with slow device streams", "[device][p2p][chunks]") {
  // 64 KiB chunks: 6 MiB + 5 moves in 97 chunks (the last 5 bytes long), each chunk's
  // device copy overlapping the previous chunk's put; the emulator delays every stream
  // operation, so a chunk used before its copy ended shows as wrong bytes.
  std::map<std::string, std::string> settings = {{"HMC_STAGE_CHUNK", "64K"}, {"HMC_HOST_ID", "host-{rank}"}};
  if (device_under_test() == "emu") settings["HMC_EMU_STREAM_DELAY_US"] = "300";
  run_exchange(settings, Side::kDevice, Side::kDevice);
  run_exchange(settings, Side::kDevice, Side::kPlainHost);
  run_exchange(settings, Side::kPlainHost, Side::kDevice, true);
}

TEST_CASE("device to and from plain host memory (staged)", "[device][p2p]") {
  run_exchange({}, Side::kDevice, Side::kPlainHost);
  run_exchange({}, Side::kPlainHost, Side::kDevice);
}

TEST_CASE("device to and from shareable host memory (IPC)", "[device][p2p]") {
  run_exchange({}, Side::kDevice, Side::kShareableHost);
  run_exchange({}, Side::kShareableHost, Side::kDevice, true);
}

// Device memory HMC did not allocate (the application's own cudaMalloc, a framework's
// pool) moves like HMC's own: HMC asks the provider (mem_query) and copies it with the
// device. Before, it took such memory for host memory, and the CPU's copy from the
// emulator's faulted. By IPC on one host (next case), staged in chunks between "hosts".
TEST_CASE("device memory the application allocated moves like HMC's own", "[device][p2p][foreign]") {
  run_exchange({}, Side::kForeignDevice, Side::kDevice);
  run_exchange({}, Side::kDevice, Side::kForeignDevice, true);
  run_exchange({}, Side::kForeignDevice, Side::kPlainHost);
  run_exchange({{"HMC_HOST_ID", "host-{rank}"}, {"HMC_STAGE_CHUNK", "1M"}}, Side::kForeignDevice, Side::kForeignDevice);
}

// A fresh file for one test's emulator event log (HMC_EMU_REGISTER_LOG), or "" with a
// warning where another provider is under test (`needs` says what the test needs of it).
std::string emu_log(const char* name, const char* needs) {
  if (device_under_test() != "emu") {
    WARN(needs << ": skipped for " << device_under_test());
    return "";
  }
  const std::string log = "/tmp/hmc-" + std::string(name) + "-" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  return log;
}

// The events the emulator logged to `log` (HMC_EMU_REGISTER_LOG) by every rank, counted by
// kind; the file is removed.
std::map<std::string, int> logged_events(const std::string& log) {
  std::map<std::string, int> count;
  std::ifstream in(log);
  std::string what;
  std::size_t bytes = 0;
  while (in >> what >> bytes) ++count[what];
  std::remove(log.c_str());
  return count;
}

// Between ranks of one host such memory goes by IPC like HMC's own: the receiver exports
// its buffer, kept by the provider's id of the allocation, and the sender imports it.
TEST_CASE("device memory the application allocated goes by IPC on one host", "[device][p2p][foreign]") {
  const std::string log = emu_log("ipc", "only the emulated provider logs its IPC");
  if (log.empty()) return;
  // Each of the exchange's 10 messages (5 sizes, both ways) lands in a fresh buffer: one
  // export and one import each.
  run_exchange({{"HMC_EMU_REGISTER_LOG", log}}, Side::kForeignDevice, Side::kForeignDevice);
  auto count = logged_events(log);
  CHECK(count["ipc_export"] == 10);
  CHECK(count["ipc_import"] == 10);
  // Five messages into one buffer: one of each. Then that buffer is freed and another made
  // (the emulator puts it at the same address): the freed one's export must not be taken
  // for it, or the next messages would land in the freed memory.
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}}, [](RankEnv& e) {
    const std::size_t n = 1 << 20;
    auto from = buffer(e.ctx, e.rank, Side::kForeignDevice, n);
    HMC_EXPECT(from.ok(), from.status().to_string());
    for (int round = 0; round < 2; ++round) {
      auto to = buffer(e.ctx, e.rank, Side::kForeignDevice, n);
      HMC_EXPECT(to.ok(), to.status().to_string());
      for (int i = 0; i < 5; ++i) {
        const uint64_t seed = 1000 + round * 10 + i;
        if (e.rank == 0) {
          from->host = random_bytes(n, seed);
          HMC_EXPECT_OK(from->push());
          HMC_EXPECT_OK(e.comm.send(from->ptr(), n, 1, 7));
        } else {
          HMC_EXPECT_OK(e.comm.recv(to->ptr(), n, 0, 7));
          HMC_EXPECT_OK(to->pull());
          HMC_EXPECT(to->host == random_bytes(n, seed), "round " + std::to_string(round) + ", message " + std::to_string(i));
        }
      }
      HMC_EXPECT_OK(e.comm.barrier());
    }
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
  count = logged_events(log);
  INFO("ipc_export " << count["ipc_export"] << ", ipc_import " << count["ipc_import"]);
  CHECK(count["ipc_export"] == 2);
  CHECK(count["ipc_import"] == 2);
}

// Device memory that cannot be exported (cudaMallocAsync's pools; here the emulator told to
// refuse another instance's memory) goes through host memory, and HMC asks to export it
// once: five messages into one such buffer make one refused export, not five.
TEST_CASE("device memory that cannot be exported is staged, and asked for once", "[device][p2p][foreign]") {
  const std::string log = emu_log("ipc-refused", "only the emulated provider can be told to refuse an export");
  if (log.empty()) return;
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}, {"HMC_EMU_EXPORT_FOREIGN", "0"}}, [](RankEnv& e) {
    const std::size_t n = 1 << 20;
    auto b = buffer(e.ctx, e.rank, Side::kForeignDevice, n);
    HMC_EXPECT(b.ok(), b.status().to_string());
    for (int i = 0; i < 5; ++i) {
      if (e.rank == 0) {
        b->host = random_bytes(n, 2000 + i);
        HMC_EXPECT_OK(b->push());
        HMC_EXPECT_OK(e.comm.send(b->ptr(), n, 1, 7));
      } else {
        HMC_EXPECT_OK(e.comm.recv(b->ptr(), n, 0, 7));
        HMC_EXPECT_OK(b->pull());
        HMC_EXPECT(b->host == random_bytes(n, 2000 + i), "message " + std::to_string(i));
      }
    }
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
  auto count = logged_events(log);
  INFO("ipc_export " << count["ipc_export"] << ", refused " << count["ipc_export_refused"] << ", ipc_import "
                     << count["ipc_import"]);
  CHECK(count["ipc_export_refused"] == 1);
  CHECK(count["ipc_export"] == 0);
  CHECK(count["ipc_import"] == 0);
}

// The receiver frees each buffer and allocates the next at the same address, as CUDA's
// allocator does with small buffers inside a block it keeps. The sender still maps the freed
// ones (its imports are cached), and the driver refuses to import the new one while it does
// (cudaErrorAlreadyMapped; the emulator refuses alike). IPC must go on: the sender closes its
// idle imports of that peer and imports again, rather than stage through host memory from
// then on.
TEST_CASE("a buffer the peer made again at a freed one's address is imported again", "[device][p2p]") {
  const std::string log = emu_log("ipc-again", "only the emulated provider logs its IPC");
  if (log.empty()) return;
  constexpr int kRounds = 5;
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}}, [](RankEnv& e) {
    const std::size_t n = 64 << 10;
    auto from = buffer(e.ctx, e.rank, Side::kPlainHost, n);
    HMC_EXPECT(from.ok(), from.status().to_string());
    void* first = nullptr;
    for (int i = 0; i < kRounds; ++i) {
      if (e.rank == 0) {
        from->host = random_bytes(n, 3000 + i);
        HMC_EXPECT_OK(from->push());
        HMC_EXPECT_OK(e.comm.send(from->ptr(), n, 1, 9));
      } else {
        auto to = buffer(e.ctx, e.rank, Side::kDevice, n);
        HMC_EXPECT(to.ok(), to.status().to_string());
        if (i == 0) first = to->ptr();
        HMC_EXPECT(to->ptr() == first, "the emulator put buffer " + std::to_string(i) + " at another address");
        HMC_EXPECT_OK(e.comm.recv(to->ptr(), n, 0, 9));
        HMC_EXPECT_OK(to->pull());
        HMC_EXPECT(to->host == random_bytes(n, 3000 + i), "message " + std::to_string(i));
      }  // `to` is freed here: the next one takes its address
      HMC_EXPECT_OK(e.comm.barrier());
    }
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
  auto count = logged_events(log);
  INFO("ipc_export " << count["ipc_export"] << ", ipc_import " << count["ipc_import"] << ", refused "
                     << count["ipc_import_refused"]);
  CHECK(count["ipc_export"] == kRounds);
  CHECK(count["ipc_import"] == kRounds);  // every message went by IPC
  CHECK(count["ipc_import_refused"] == kRounds - 1);
}

// Rank 0 sends `rounds` messages of 64 KiB (past the eager limit: rendezvous, so IPC
// offers) from host memory, the first over e.comm and the rest over a second communicator,
// split onto `second` (e.ctx when null); rank 1 receives each into a fresh device buffer of
// e.ctx, freed after unless keep(i). A freed buffer's successor must take its address (the
// emulator's allocator does), a kept one's not; every message arrives intact.
// A communicator of the same ranks as e.comm on another context: rank 0 makes its id and
// sends it over e.comm.
Result<Communicator> on_context(RankEnv& e, Context& ctx) {
  std::string text;
  if (e.rank == 0) {
    auto id = ctx.create_unique_id();
    if (!id) return id.status();
    text = id->to_string();
    text.resize(256, '\0');
    for (int r = 1; r < e.size; ++r)
      if (Status s = e.comm.send(text.data(), text.size(), r, 11); !s.ok()) return s;
  } else {
    text.resize(256);
    if (Status s = e.comm.recv(text.data(), text.size(), 0, 11); !s.ok()) return s;
  }
  auto id = UniqueId::parse(text.c_str());
  if (!id) return id.status();
  return Communicator::create(ctx, id.value(), e.rank, e.size);
}

int second_comm_rounds(RankEnv& e, Context* second, int rounds, uint64_t salt, const std::function<bool(int)>& keep) {
  auto other = second ? on_context(e, *second) : split(e.ctx, e.comm, 0, e.rank);
  HMC_EXPECT(other.ok(), other.status().to_string());
  const std::size_t n = 64 << 10;
  std::vector<DevBuf> kept;
  void* last = nullptr;
  for (int i = 0; i < rounds; ++i) {
    Communicator& comm = i == 0 ? e.comm : other.value();
    const auto data = random_bytes(n, salt + i);
    if (e.rank == 0) {
      std::vector<uint8_t> from = data;
      HMC_EXPECT_OK(comm.send(from.data(), n, 1, 9));
    } else {
      auto to = buffer(e.ctx, e.rank, Side::kDevice, n);
      HMC_EXPECT(to.ok(), to.status().to_string());
      if (i > 0)
        HMC_EXPECT((to->ptr() == last) == !keep(i - 1), "buffer " + std::to_string(i) + " is not where expected");
      last = to->ptr();
      HMC_EXPECT_OK(comm.recv(to->ptr(), n, 0, 9));
      HMC_EXPECT_OK(to->pull());
      HMC_EXPECT(to->host == data, "message " + std::to_string(i));
      if (keep(i)) kept.push_back(std::move(to.value()));
    }
    HMC_EXPECT_OK(e.comm.barrier());
  }
  HMC_EXPECT_OK(other->finalize());
  return 0;
}

// Runs second_comm_rounds on two ranks, its second communicator on a context of its own
// when `own_context`, and returns the emulator's IPC events (nullopt off the emulator).
std::optional<std::map<std::string, int>> second_comm_events(const char* name, bool own_context, int rounds,
                                                             uint64_t salt, const std::function<bool(int)>& keep) {
  const std::string log = emu_log(name, "only the emulated provider logs its IPC");
  if (log.empty()) return std::nullopt;
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}}, [&](RankEnv& e) {
    if (!own_context) return second_comm_rounds(e, nullptr, rounds, salt, keep);
    auto second = Context::create({{{"HMC_EMU_REGISTER_LOG", log}}});
    HMC_EXPECT(second.ok(), second.status().to_string());
    return second_comm_rounds(e, &second.value(), rounds, salt, keep);
  }, kWait);
  REQUIRE(all_ok(exits));
  return logged_events(log);  // the checks below expand to the counts
}

// The same with a second communicator of the context between the two ranks: the first
// made the import of the freed buffer X, and the second's import of Y, made at X's
// address, is refused until X's import is closed. Imports belong to the context, so the
// second closes it and Y goes by IPC too, as does Z (made while Y is kept).
TEST_CASE("a second communicator closes the first's stale import to import a buffer", "[device][p2p]") {
  auto count = second_comm_events("ipc-second-comm", false, 3, 4000, [](int i) { return i > 0; });
  if (!count) return;
  CHECK((*count)["ipc_import_refused"] == 1);
  CHECK((*count)["ipc_import"] == 3);  // X, Y and Z: nothing went through host memory
}

// Two contexts of one process do not share imports, but the driver's refusal is the
// process's: the second communicator, on a second context of rank 0, cannot close the
// first context's import of X, and so cannot import Y. Y is staged; IPC goes on for Z.
TEST_CASE("a buffer one context cannot import is staged, and IPC goes on for others", "[device][p2p]") {
  auto count = second_comm_events("ipc-strike", true, 3, 4000, [](int i) { return i > 0; });
  if (!count) return;
  CHECK((*count)["ipc_import_refused"] == 1);
  CHECK((*count)["ipc_import"] == 2);  // X and Z; Y went through host memory
}

// Past Peer::kIpcStrikes (8) refused imports IPC stays off for the pair: the communicator
// of the second context sends into 11 buffers, each freed after and made again at the
// address the first context's import still maps. Eight are refused, the rest not even offered.
TEST_CASE("IPC stays off for a pair after eight refused imports", "[device][p2p]") {
  auto count = second_comm_events("ipc-strikes", true, 12, 5000, [](int) { return false; });
  if (!count) return;
  CHECK((*count)["ipc_import"] == 1);
  CHECK((*count)["ipc_import_refused"] == 8);
}

// Two communicators of one context receive into one device buffer: its sender imports it
// once, for both.
TEST_CASE("communicators of one context share their imports of a peer's buffer", "[device][p2p]") {
  const std::string log = emu_log("ipc-shared", "only the emulated provider logs its IPC");
  if (log.empty()) return;
  auto exits = run_ranks(2, {{"HMC_EMU_REGISTER_LOG", log}}, [](RankEnv& e) {
    auto other = split(e.ctx, e.comm, 0, e.rank);
    HMC_EXPECT(other.ok(), other.status().to_string());
    const std::size_t n = 64 << 10;
    auto to = buffer(e.ctx, e.rank, Side::kDevice, n);
    HMC_EXPECT(to.ok(), to.status().to_string());
    for (int i = 0; i < 4; ++i) {
      Communicator& comm = i % 2 ? other.value() : e.comm;
      const auto data = random_bytes(n, 6000 + i);
      if (e.rank == 0) {
        std::vector<uint8_t> from = data;
        HMC_EXPECT_OK(comm.send(from.data(), n, 1, 9));
      } else {
        HMC_EXPECT_OK(comm.recv(to->ptr(), n, 0, 9));
        HMC_EXPECT_OK(to->pull());
        HMC_EXPECT(to->host == data, "message " + std::to_string(i));
      }
    }
    HMC_EXPECT_OK(other->finalize());
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
  auto count = logged_events(log);
  INFO("ipc_export " << count["ipc_export"] << ", ipc_import " << count["ipc_import"]);
  CHECK(count["ipc_import"] == 1);
}

TEST_CASE("HMC names the device of memory it did not allocate, unless told not to ask", "[device][foreign]") {
  for (const char* query : {"1", "0"}) {
    auto exits = run_ranks(2, {{"HMC_MEM_QUERY", query}}, [&](RankEnv& e) {
      const std::size_t n = 1 << 20;
      auto b = buffer(e.ctx, e.rank, Side::kForeignDevice, n);
      HMC_EXPECT(b.ok(), b.status().to_string());
      auto* middle = static_cast<uint8_t*>(b->ptr()) + n / 2;
      const DeviceId where = e.ctx.device_of(middle);
      if (std::string(query) == "0") {  // taken for host memory, so nothing may touch it
        HMC_EXPECT(where.provider == "cpu", "device_of says " + where.to_string() + " with HMC_MEM_QUERY=0");
        return 0;
      }
      HMC_EXPECT(where.provider == device_under_test() && where.index == device_for(e.ctx, e.rank).index,
                 "device_of says " + where.to_string());
      // Context::copy both ways, and registration for puts from the peer refused as for
      // HMC's own device memory (no net provider here touches device memory).
      b->host = random_bytes(n, 5);
      HMC_EXPECT_OK(b->push());
      std::vector<uint8_t> back(n / 2);
      HMC_EXPECT_OK(e.ctx.copy(back.data(), middle, n / 2));
      HMC_EXPECT(std::equal(back.begin(), back.end(), b->host.begin() + n / 2), "copy from the middle");
      auto reg = e.comm.register_memory(b->ptr(), n);
      HMC_EXPECT(!reg.ok() && reg.status().code() == ErrorCode::kUnsupported, reg.status().to_string());
      return 0;
    }, kWait);
    INFO("HMC_MEM_QUERY=" << query << ": " << describe(exits));
    REQUIRE(all_ok(exits));
  }
}

TEST_CASE("the path names how device memory moves", "[device][p2p]") {
  auto exits = run_ranks(2, {}, [](RankEnv& e) {
    const PathInfo& p = e.comm.path(1 - e.rank);
    // "IPC for cuda memory ..." (or "IPC for emu, cuda memory ..." where both are loaded)
    auto ipc = p.device_path.substr(0, p.device_path.find(" memory"));
    HMC_EXPECT(ipc.rfind("IPC for ", 0) == 0 && ipc.find(device_under_test()) != std::string::npos, p.device_path);
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
}

// A device send to a peer on this host goes by rendezvous at any size (the receiver takes it
// by IPC), so it waits for its receive; to another host a small one still goes eagerly,
// staged through host memory, and completes on its own. Rank 1 receives into device memory
// after rank 0 said go, and checks the bytes.
TEST_CASE("small device sends wait for their receive on one host and not across hosts", "[device][p2p]") {
  for (const bool two_hosts : {false, true}) {
    DYNAMIC_SECTION((two_hosts ? "two hosts" : "one host")) {
      std::map<std::string, std::string> settings;
      if (two_hosts) settings["HMC_HOST_ID"] = "host-{rank}";
      auto exits = run_ranks(2, settings, [two_hosts](RankEnv& e) {
        constexpr std::size_t kBytes = 64;
        constexpr uint64_t kTag = 5, kGoTag = 6;
        auto b = buffer(e.ctx, e.rank, Side::kDevice, kBytes);
        HMC_EXPECT(b.ok(), b.status().to_string());
        char go = 1;
        if (e.rank == 0) {
          b->host = random_bytes(kBytes, 17);
          HMC_EXPECT_OK(b->push());
          Request send = e.comm.isend(b->ptr(), kBytes, 1, kTag);
          const Status early = send.wait(std::chrono::milliseconds(two_hosts ? 5000 : 300));
          HMC_EXPECT(early.ok() == two_hosts, "64 B from device memory before the receive: " + early.to_string());
          HMC_EXPECT_OK(e.comm.send(&go, 1, 1, kGoTag));
          HMC_EXPECT_OK(send.wait(kWait));
          return 0;
        }
        b->host.assign(kBytes, 0xEE);
        HMC_EXPECT_OK(b->push());
        HMC_EXPECT_OK(e.comm.recv(&go, 1, 0, kGoTag));
        HMC_EXPECT_OK(e.comm.irecv(b->ptr(), kBytes, 0, kTag).wait(kWait));
        HMC_EXPECT_OK(b->pull());
        HMC_EXPECT(b->host == random_bytes(kBytes, 17), "wrong bytes");
        return 0;
      }, kWait);
      INFO(describe(exits));
      REQUIRE(all_ok(exits));
    }
  }
}

TEST_CASE("one-sided put from device memory and into device memory", "[device][p2p]") {
  auto exits = run_ranks(2, {}, [](RankEnv& e) {
    const std::size_t n = 300000;
    auto dev = buffer(e.ctx, e.rank, Side::kDevice, n);
    HMC_EXPECT(dev.ok(), dev.status().to_string());
    // Registering device memory for puts needs a net provider that touches it.
    auto reg = e.comm.register_memory(dev->ptr(), n);
    HMC_EXPECT(!reg.ok() && reg.status().code() == ErrorCode::kUnsupported, reg.status().to_string());
    // A device source is staged: rank 0 puts into rank 1's host region.
    std::vector<uint8_t> target(n, 0);
    auto mr = e.comm.register_memory(target.data(), n);
    HMC_EXPECT(mr.ok(), mr.status().to_string());
    RemoteKey mine = mr->pack(), theirs;
    uint64_t len = mine.bytes.size(), their_len = 0;
    HMC_EXPECT_OK(e.comm.send(&len, sizeof(len), 1 - e.rank, 2));
    HMC_EXPECT_OK(e.comm.recv(&their_len, sizeof(their_len), 1 - e.rank, 2));
    theirs.bytes.resize(their_len);
    HMC_EXPECT_OK(e.comm.send(mine.bytes.data(), mine.bytes.size(), 1 - e.rank, 1));
    HMC_EXPECT_OK(e.comm.recv(theirs.bytes.data(), theirs.bytes.size(), 1 - e.rank, 1));
    if (e.rank == 0) {
      dev->host = random_bytes(n, 99);
      HMC_EXPECT_OK(dev->push());
      HMC_EXPECT_OK(e.comm.put(1, dev->ptr(), n, theirs, 0, 5).wait(kWait));
    } else {
      auto v = e.comm.wait_notify(0, std::chrono::seconds(30));
      HMC_EXPECT(v.ok() && v.value() == 5, v.status().to_string());
      HMC_EXPECT(target == random_bytes(n, 99), "put from device memory landed wrong");
    }
    HMC_EXPECT_OK(e.comm.barrier());
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
}

// HMC_HOST_REGISTER: host buffers of HMC's allocations that a device copies >= 1 MiB of at
// once are registered with the device provider (a CPU rank's own buffer going to a device,
// a peer's shareable buffer a device writes into), and every registration ends before its
// memory is freed or unmapped. The emulated provider checks that and logs each event to a file.
TEST_CASE("host memory registered for device copies is unregistered before it goes", "[device][p2p][register]") {
  const std::string log = emu_log("register", "only the emulated provider logs its registrations");
  if (log.empty()) return;
  const std::map<std::string, std::string> settings = {{"HMC_EMU_REGISTER_LOG", log}, {"HMC_HOST_REGISTER", "1M"}};
  run_exchange(settings, Side::kDevice, Side::kShareableHost);
  run_exchange(settings, Side::kShareableHost, Side::kDevice);
  auto count = logged_events(log);
  const int registered = count["register"], unregistered = count["unregister"];
  std::vector<std::string> other;  // unmapped-before-unregister, left-registered
  for (const auto& [what, n] : count)
    if (what != "register" && what != "unregister" && what.rfind("ipc_", 0) != 0) other.push_back(what);
  INFO("register " << registered << ", unregister " << unregistered);
  // Two sizes >= 1M (1 MiB, 6 MiB + 5), each sent both ways, in each exchange: the peer's
  // imported buffer, then the sender's own buffer.
  CHECK(registered == 8);
  CHECK(unregistered == registered);
  CHECK(other.empty());
}

// A chunk whose device copy fails ends that transfer on both sides with the reason and
// leaves the communicator working. The emulator fails rank 1's tenth stream operation
// (HMC_EMU_FAIL_STREAM_OP="{rank}0": rank 0 never), the event behind its fifth chunk, and
// its streams stay failed after that; slow streams keep rank 0's copies running meanwhile.
TEST_CASE("a failed chunk copy fails the staged transfer, not the communicator", "[device][p2p][chunks]") {
  if (device_under_test() != "emu") {
    WARN("only the emulated provider injects copy failures: skipped for " << device_under_test());
    return;
  }
  const std::map<std::string, std::string> settings = {{"HMC_STAGE_CHUNK", "64K"},
                                                       {"HMC_HOST_ID", "host-{rank}"},
                                                       {"HMC_EMU_FAIL_STREAM_OP", "{rank}0"},
                                                       {"HMC_EMU_STREAM_DELAY_US", "300"}};
  auto exits = run_ranks(2, settings, [](RankEnv& e) {
    const std::size_t n = (1 << 20) + 7;  // 17 chunks
    auto b = buffer(e.ctx, e.rank, Side::kDevice, n);
    HMC_EXPECT(b.ok(), b.status().to_string());
    b->host = random_bytes(n, 3);
    HMC_EXPECT_OK(b->push());
    const int peer = 1 - e.rank;
    auto transfer = [&](int sender, int tag) {
      return e.rank == sender ? e.comm.isend(b->ptr(), n, peer, tag).wait(kWait) : e.comm.irecv(b->ptr(), n, peer, tag).wait(kWait);
    };
    // Rank 1 -> rank 0: the sender's fifth chunk never gets off its device.
    Status s = transfer(1, 1);
    HMC_EXPECT(!s.ok() && s.code() != ErrorCode::kTimeout, s.to_string());
    if (e.rank == 0) HMC_EXPECT(s.message().find("rank 1 could not send") != std::string::npos, s.to_string());
    else HMC_EXPECT(s.message().find("HMC_EMU_FAIL_STREAM_OP") != std::string::npos, s.to_string());
    // Rank 0 -> rank 1: the receiver's stream stays failed, so its first copy fails; the sender is done.
    s = transfer(0, 2);
    if (e.rank == 0) HMC_EXPECT(s.ok(), s.to_string());
    else HMC_EXPECT(!s.ok() && s.message().find("HMC_EMU_FAIL_STREAM_OP") != std::string::npos, s.to_string());
    // Host memory still moves both ways.
    std::vector<uint8_t> out = random_bytes(300000, 10 + e.rank), in(300000, 0);
    Request r = e.comm.irecv(in.data(), in.size(), peer, 3);
    HMC_EXPECT_OK(e.comm.send(out.data(), out.size(), peer, 3));
    HMC_EXPECT_OK(r.wait(kWait));
    HMC_EXPECT(in == random_bytes(300000, 10 + peer), "host bytes after the failed transfers");
    return 0;
  }, kWait);
  REQUIRE(all_ok(exits));
}

// Device copies end without a wake on CUDA: nothing calls host->wake when a stream op is
// done, so a waiter behind an IPC copy must keep polling its event rather than sleep.
// The emulator behaves so with HMC_EMU_STREAM_WAKE=0. Each 1 MiB send is an IPC copy and
// an event record on a stream whose every operation waits 2 ms first: 4 ms of stream work.
// The third-fastest of 16 sends, on 2 cores: 4.15-4.24 ms one day, 4.41-4.59 another
// (with the emulator's wake on as well: the machine, not the wait); waiters that counted a
// running copy as idle (yields, kQuietTime, then 1 ms sleeps) took 4.64-4.76 and 4.64-4.68
// on those days (4.52-4.68 a round on the slower one). Load only makes sends slower, so
// the best of up to 3 rounds must be under 4.55 ms. On the slower day that passed the
// waiter as landed 10 times in 10 and failed such waiters 5 times in 6 (the bound of
// before, 4.45 in 1 round, failed the waiter as landed 2-3 times in 10). This case runs
// alone (tests/device/CMakeLists.txt).
TEST_CASE("a waiter behind a device copy sees it end without a wake", "[device][p2p][timing]") {
  if (device_under_test() != "emu") {
    WARN("needs the emulated device: skipped");
    return;
  }
  auto* best = static_cast<int64_t*>(
      mmap(nullptr, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(best != MAP_FAILED);
  *best = INT64_MAX;
  for (int round = 0; round < 3 && *best >= 4550; ++round) {
    std::map<std::string, std::string> s{{"HMC_EMU_STREAM_DELAY_US", "2000"}, {"HMC_EMU_STREAM_WAKE", "0"}};
    auto exits = run_ranks(2, s, [best](RankEnv& e) {
      const std::size_t n = 1 << 20;
      auto b = buffer(e.ctx, e.rank, Side::kDevice, n);
      HMC_EXPECT(b.ok(), b.status().to_string());
      std::vector<int64_t> took;
      for (int i = 0; i < 16; ++i) {
        if (e.rank == 1) {
          HMC_EXPECT_OK(e.comm.recv(b->ptr(), n, 0, 9));
          continue;
        }
        const auto t0 = std::chrono::steady_clock::now();
        HMC_EXPECT_OK(e.comm.send(b->ptr(), n, 1, 9));
        took.push_back(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
      }
      if (e.rank == 0) {
        std::sort(took.begin(), took.end());
        std::string all;
        for (int64_t t : took) all += " " + std::to_string(t);
        std::fprintf(stderr, "[rank 0] us per send (4000 of stream work):%s\n", all.c_str());
        *best = std::min(*best, took[2]);
      }
      return 0;
    }, kWait);
    INFO(describe(exits));
    REQUIRE(all_ok(exits));
  }
  const int64_t third = *best;
  munmap(best, sizeof(int64_t));
  REQUIRE(third < 4550);
}
