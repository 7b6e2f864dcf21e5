// Collectives over shared segments (collectives/shm_coll.h), in real processes: exact
// results with several in flight (slots reused only once every rank read them), small ones
// and ones of several rounds, and the message path still right with them turned off. A
// lost peer failing a pending one is in test_collectives.cpp ("a lost peer fails the
// collective on the survivors").
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "collectives/comm_state.h"
#include "collectives/shm_coll.h"
#include "core/comm_impl.h"
#include "hmc/collectives.h"
#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

const auto kWait = std::chrono::seconds(30);

std::map<std::string, std::string> shm(bool on) {
  return {{"HMC_TIMEOUT", "30s"}, {"HMC_SHM_COLL", on ? "1" : "0"}};
}

// CLOCK_MONOTONIC in microseconds: one clock for every process of the host.
int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Value element i of rank r contributes to call k.
int32_t in(int k, int r, std::size_t i) { return static_cast<int32_t>(k * 1000 + r * 10 + static_cast<int>(i)); }

int check_rounds(RankEnv& e, bool expect_segments) {
  const int n = e.size, me = e.rank;
  HMC_EXPECT((e.comm.impl().segments() != nullptr) == expect_segments,
             std::string("segments ") + (expect_segments ? "missing" : "present"));
  constexpr std::size_t kCount = 3;
  // Five calls in flight before any wait: the third must wait for every rank to finish
  // reading the first one's slot.
  constexpr int kCalls = 5;
  std::vector<std::vector<int32_t>> send(kCalls), recv(kCalls);
  std::vector<Request> reqs;
  for (int k = 0; k < kCalls; ++k) {
    const int kind = k % 3;  // all_reduce, all_gather, all_to_all
    const std::size_t in_elems = kind == 2 ? kCount * n : kCount;
    const std::size_t out_elems = kind == 0 ? kCount : kCount * n;
    for (std::size_t i = 0; i < in_elems; ++i) send[k].push_back(in(k, me, i));
    recv[k].assign(out_elems, -1);
    if (kind == 0)
      reqs.push_back(all_reduce(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32, ReduceOp::kSum));
    else if (kind == 1)
      reqs.push_back(all_gather(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32));
    else
      reqs.push_back(all_to_all(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32));
  }
  for (int k = kCalls - 1; k >= 0; --k) HMC_EXPECT_OK(reqs[k].wait(kWait));
  for (int k = 0; k < kCalls; ++k) {
    const int kind = k % 3;
    for (std::size_t j = 0; j < recv[k].size(); ++j) {
      int32_t want = 0;
      if (kind == 0)
        for (int r = 0; r < n; ++r) want += in(k, r, j);
      else if (kind == 1)
        want = in(k, static_cast<int>(j / kCount), j % kCount);
      else
        want = in(k, static_cast<int>(j / kCount), me * kCount + j % kCount);
      HMC_EXPECT(recv[k][j] == want, "call " + std::to_string(k) + " element " + std::to_string(j) + ": " +
                                          std::to_string(recv[k][j]) + ", want " + std::to_string(want));
    }
  }
  // Many rounds one after another, in place, each checked: slots alternate and refill.
  for (int k = 0; k < 300; ++k) {
    double v[2] = {me + 0.25 * k, -1.0 * me};
    HMC_EXPECT_OK(all_reduce(e.comm, v, v, 2, DataType::kFloat64, ReduceOp::kMax).wait(kWait));
    HMC_EXPECT(v[0] == (n - 1) + 0.25 * k && v[1] == 0.0, "round " + std::to_string(k));
  }
  return 0;
}

// Collectives of several rounds (kSlotBytes per rank each), with lengths that divide into
// neither rounds nor shares, in place and not, all in flight at once.
int check_large(RankEnv& e) {
  const int n = e.size, me = e.rank;
  const std::size_t reduce_count = coll::kSlotBytes / 4 * 2 + 1001;   // three rounds, shares uneven
  const std::size_t gather_count = coll::kSlotBytes / 4 + 333;         // per rank: two rounds
  const std::size_t block = coll::kSlotBytes / 4 / n + 77;             // per block: two rounds
  for (bool in_place : {false, true}) {
    const int k = in_place ? 1 : 0;
    std::vector<int32_t> rs(reduce_count), rr(reduce_count, -1), gs(gather_count), gr(gather_count * n, -1),
        as(block * n), ar(block * n, -1);
    for (std::size_t i = 0; i < reduce_count; ++i) rs[i] = in(k, me, i);
    for (std::size_t i = 0; i < gather_count; ++i) gs[i] = in(k + 2, me, i);
    for (std::size_t i = 0; i < block * n; ++i) as[i] = in(k + 4, me, i);
    if (in_place) {
      rr = rs;
      std::copy(gs.begin(), gs.end(), gr.begin() + me * gather_count);
      ar = as;
    }
    std::vector<Request> reqs;
    reqs.push_back(all_reduce(e.comm, in_place ? rr.data() : rs.data(), rr.data(), reduce_count, DataType::kInt32,
                              ReduceOp::kSum));
    reqs.push_back(all_gather(e.comm, in_place ? gr.data() + me * gather_count : gs.data(), gr.data(), gather_count,
                              DataType::kInt32));
    reqs.push_back(all_to_all(e.comm, in_place ? ar.data() : as.data(), ar.data(), block, DataType::kInt32));
    for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) HMC_EXPECT_OK(it->wait(kWait));
    const std::string form = in_place ? " (in place)" : "";
    for (std::size_t i = 0; i < reduce_count; ++i) {
      int32_t want = 0;
      for (int r = 0; r < n; ++r) want += in(k, r, i);
      HMC_EXPECT(rr[i] == want, "all_reduce" + form + " element " + std::to_string(i));
    }
    for (std::size_t j = 0; j < gr.size(); ++j)
      HMC_EXPECT(gr[j] == in(k + 2, static_cast<int>(j / gather_count), j % gather_count),
                 "all_gather" + form + " element " + std::to_string(j));
    for (std::size_t j = 0; j < ar.size(); ++j)
      HMC_EXPECT(ar[j] == in(k + 4, static_cast<int>(j / block), me * block + j % block),
                 "all_to_all" + form + " element " + std::to_string(j));
  }
  return 0;
}

// reduce_scatter (in place and not) and broadcast from the last rank, of two rounds each,
// and reduce to rank 0, of three rounds of shares and of one round reduced whole, in
// flight together.
int check_large_rooted(RankEnv& e) {
  const int n = e.size, me = e.rank, root = n - 1;
  const std::size_t block = coll::kSlotBytes / 4 / n + 77, count = coll::kSlotBytes / 4 + 555;
  std::vector<int32_t> send(block * n), out(block, -1), inplace(block * n), bc(count, -1);
  for (std::size_t i = 0; i < block * n; ++i) send[i] = inplace[i] = in(6, me, i);
  if (me == root)
    for (std::size_t i = 0; i < count; ++i) bc[i] = in(7, root, i);
  std::vector<Request> reqs;
  reqs.push_back(reduce_scatter(e.comm, send.data(), out.data(), block, DataType::kInt32, ReduceOp::kSum));
  reqs.push_back(broadcast(e.comm, bc.data(), count, DataType::kInt32, root));
  int32_t* mine = inplace.data() + me * block;
  reqs.push_back(reduce_scatter(e.comm, inplace.data(), mine, block, DataType::kInt32, ReduceOp::kMax));
  const std::size_t big = coll::kSlotBytes / 4 * 2 + 1001, small = 5;
  std::vector<int32_t> rin(big), rbig(big, -1), rsmall(small, -1);
  for (std::size_t i = 0; i < big; ++i) rin[i] = in(8, me, i);
  reqs.push_back(reduce(e.comm, rin.data(), rbig.data(), big, DataType::kInt32, ReduceOp::kSum, 0));
  reqs.push_back(reduce(e.comm, rin.data(), rsmall.data(), small, DataType::kInt32, ReduceOp::kSum, 0));
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) HMC_EXPECT_OK(it->wait(kWait));
  for (std::size_t i = 0; i < big; ++i) {
    int32_t sum = 0;
    for (int r = 0; r < n; ++r) sum += in(8, r, i);
    const int32_t want = me == 0 ? sum : -1;  // other ranks' receive buffers stay untouched
    HMC_EXPECT(rbig[i] == want, "reduce element " + std::to_string(i));
    if (i < small) HMC_EXPECT(rsmall[i] == want, "small reduce element " + std::to_string(i));
  }
  for (std::size_t i = 0; i < block; ++i) {
    int32_t sum = 0, max = in(6, 0, me * block + i);
    for (int r = 0; r < n; ++r) sum += in(6, r, me * block + i), max = std::max(max, in(6, r, me * block + i));
    HMC_EXPECT(out[i] == sum, "reduce_scatter element " + std::to_string(i));
    HMC_EXPECT(mine[i] == max, "reduce_scatter (in place) element " + std::to_string(i));
  }
  for (std::size_t i = 0; i < count; ++i) HMC_EXPECT(bc[i] == in(7, root, i), "broadcast element " + std::to_string(i));
  return 0;
}

// A barrier over the segments holds every rank until the last one arrives: in each of 20
// rounds one rank comes 20 ms late, and no rank may leave before it came (CLOCK_MONOTONIC is
// one clock for every process of the host). Each barrier takes one sequence number.
int check_barrier(RankEnv& e) {
  const int n = e.size;
  auto& seq = coll::comm_state(e.comm.impl()).shm->next;
  for (int k = 0; k < 20; ++k) {
    if (k % n == e.rank) usleep(20000);
    const int64_t entered = now_us(), before = static_cast<int64_t>(seq.load());
    HMC_EXPECT_OK(barrier(e.comm).wait(kWait));
    const int64_t left = now_us();
    HMC_EXPECT(static_cast<int64_t>(seq.load()) == before + 1, "barrier took no round of the segments");
    std::vector<int64_t> all(n);
    HMC_EXPECT_OK(all_gather(e.comm, &entered, all.data(), 1, DataType::kInt64).wait(kWait));
    const int64_t last = *std::max_element(all.begin(), all.end());
    HMC_EXPECT(left >= last, "round " + std::to_string(k) + ": left " + std::to_string(last - left) +
                                 " us before the last rank arrived");
  }
  return 0;
}

// A waiter asleep on the segments (its peer 30 ms late) is woken by the peer's write, not
// by the end of its sleep (kBellSlice, 20 ms, core/progress.cpp): over 9 rounds the
// median time from the late rank's arrival to the early rank's return stays under 2 ms.
// Without the ring it is spread over the slice (median about 10 ms); a waiter that never
// sleeps on the bell (the condition variable instead) is caught by the count of rings: 0
// then. Under two other multi-process test programs on 2 cores 4 rings in 9 rounds were
// seen, and twice 0 with prompt returns (not explained), hence 3 asked and the test alone.
int check_bell(RankEnv& e) {
  // The bell is this rank's futex word: rank 0 must have slept on it, and rank 1 rung it.
  const auto* bell = reinterpret_cast<const uint32_t*>(e.comm.impl().segments()->of(e.rank) +
                                                       core::HostSegments::kBellOff);
  const uint32_t rung_before = __atomic_load_n(bell, __ATOMIC_ACQUIRE);
  std::vector<int64_t> late_by;
  for (int k = 0; k < 9; ++k) {
    int64_t arrived = 0, when = 0;
    if (e.rank == 1) {
      usleep(30000);
      arrived = now_us();
    }
    const int32_t one = 1;
    int32_t sum = 0;
    HMC_EXPECT_OK(all_reduce(e.comm, &one, &sum, 1, DataType::kInt32, ReduceOp::kSum).wait(kWait));
    const int64_t left = now_us();
    HMC_EXPECT(sum == e.size, "all_reduce gave " + std::to_string(sum));
    HMC_EXPECT_OK(all_reduce(e.comm, &arrived, &when, 1, DataType::kInt64, ReduceOp::kMax).wait(kWait));
    late_by.push_back(left - when);
  }
  if (e.rank != 0) return 0;
  std::sort(late_by.begin(), late_by.end());
  std::string all;
  for (int64_t t : late_by) all += " " + std::to_string(t);
  HMC_EXPECT(late_by[4] < 2000, "rank 0 returned this many us after rank 1 arrived:" + all);
  const uint32_t rings = __atomic_load_n(bell, __ATOMIC_ACQUIRE) - rung_before;
  HMC_EXPECT(rings >= 3, "rank 0's bell rang " + std::to_string(rings) + " times in 9 late rounds (returned, us after "
                         "rank 1 arrived:" + all + ")");
  return 0;
}

// Whether the first bytes of `input` are at `at` in either of this rank's slots.
bool in_slots(RankEnv& e, const void* input, std::size_t at = 0) {
  const auto& segs = e.comm.impl().segments();
  for (uint64_t b = 0; b < 2; ++b) {
    const uint8_t* data = segs->of(e.rank) + core::HostSegments::slot_off(b) + core::HostSegments::kSlotHeader;
    if (std::memcmp(data + at, input, 64) == 0) return true;
  }
  return false;
}

// A 2-rank all_gather of 100 KiB and of 2 MiB (four slots' worth) per rank, and an
// all_to_all of as much per block, read the other rank's buffer directly (cross-memory
// attach, where the ranks agreed they can): exact in place and not, and their input never
// went through this rank's slots.
int check_cma_direct(RankEnv& e) {
  const int me = e.rank;
  const auto& segs = e.comm.impl().segments();
  HMC_EXPECT(segs != nullptr, "no segments");
  for (std::size_t bytes : {std::size_t{100} << 10, std::size_t{2} << 20})
  for (bool in_place : {false, true}) {
    const std::size_t count = bytes / 4;
    const int k = (in_place ? 10 : 9) + (bytes > coll::kSlotBytes ? 4 : 0);
    std::vector<int32_t> send(count), out(2 * count, -1);
    for (std::size_t i = 0; i < count; ++i) send[i] = in(k, me, i);
    if (in_place) std::copy(send.begin(), send.end(), out.begin() + me * count);
    const int32_t* from = in_place ? out.data() + me * count : send.data();
    HMC_EXPECT_OK(all_gather(e.comm, from, out.data(), count, DataType::kInt32).wait(kWait));
    for (std::size_t j = 0; j < out.size(); ++j)
      HMC_EXPECT(out[j] == in(k, static_cast<int>(j / count), j % count), "all_gather element " + std::to_string(j));
    // Through the slots, the last round's part of the input would still be in one.
    const std::size_t last = (bytes - 1) / coll::kSlotBytes * coll::kSlotBytes / 4;
    HMC_EXPECT(!segs->cma() || !in_slots(e, from + last), "the all_gather input went through a slot");
    // all_to_all: block j of rank r goes to rank j.
    std::vector<int32_t> a2a(2 * count), got(2 * count, -1);
    for (std::size_t i = 0; i < 2 * count; ++i) a2a[i] = in(k + 2, me, i);
    if (in_place) got = a2a;
    HMC_EXPECT_OK(all_to_all(e.comm, in_place ? got.data() : a2a.data(), got.data(), count, DataType::kInt32).wait(kWait));
    for (std::size_t j = 0; j < got.size(); ++j)
      HMC_EXPECT(got[j] == in(k + 2, static_cast<int>(j / count), me * count + j % count),
                 std::string("all_to_all") + (in_place ? " (in place)" : "") + " element " + std::to_string(j));
    // Through the slots, the last round's part of the block for the other rank would sit
    // at its place in one.
    const std::size_t other = static_cast<std::size_t>(1 - me) * count;
    const std::size_t part = std::min(bytes, coll::kSlotBytes / 2 / 64 * 64);
    const std::size_t last_part = (bytes - 1) / part * part / 4;
    HMC_EXPECT(!segs->cma() || !in_slots(e, a2a.data() + other + last_part, (1 - me) * part),
               "the all_to_all input went through a slot");
  }
  if (!segs->cma()) std::fprintf(stderr, "rank %d: no cross-memory attach here; the slots were used\n", me);
  return 0;
}

// Blocks past what one cross-memory read moves (2 GiB - 4 KiB on Linux): all_gather in
// place and all_to_all in place, 2 GiB + 4099 bytes of each rank's. They failed with "short
// read". About 13 GB of memory in all: skipped where less is available (CI), and where
// processes may not read each other's memory (the GPU machine): the slots serve then.
std::size_t available_kb() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  std::size_t kb = 0;
  while (std::fgets(line, sizeof(line), f))
    if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

uint8_t large_byte(int r, std::size_t i) { return static_cast<uint8_t>(i * 131 + (i >> 20) + r * 7); }

int check_cma_large(RankEnv& e) {
  const int me = e.rank;
  const std::size_t block = (std::size_t{2} << 30) + 4099;
  HMC_EXPECT(e.comm.impl().segments() != nullptr, "no segments");
  if (!e.comm.impl().segments()->cma()) {
    std::fprintf(stderr, "rank %d: skipped: no cross-memory attach here\n", me);
    return 0;
  }
  {
    std::vector<uint8_t> all(2 * block);
    for (std::size_t i = 0; i < block; ++i) all[me * block + i] = large_byte(me, i);
    uint8_t* mine = all.data() + me * block;
    HMC_EXPECT_OK(all_gather(e.comm, mine, all.data(), block, DataType::kUint8).wait(std::chrono::minutes(5)));
    for (std::size_t j = 0; j < all.size(); ++j)
      HMC_EXPECT(all[j] == large_byte(static_cast<int>(j / block), j % block), "all_gather byte " + std::to_string(j));
  }
  // all_to_all: block j of rank r goes to rank j; rank r's byte i of block j is
  // large_byte(2r + j, i).
  std::vector<uint8_t> a2a(2 * block);
  for (std::size_t j = 0; j < a2a.size(); ++j) a2a[j] = large_byte(2 * me + static_cast<int>(j / block), j % block);
  HMC_EXPECT_OK(all_to_all(e.comm, a2a.data(), a2a.data(), block, DataType::kUint8).wait(std::chrono::minutes(5)));
  for (std::size_t j = 0; j < a2a.size(); ++j)
    HMC_EXPECT(a2a[j] == large_byte(2 * static_cast<int>(j / block) + me, j % block), "all_to_all byte " + std::to_string(j));
  return 0;
}

// Whether shared memory may come in transparent huge pages here (then a touched word
// commits 2 MiB, and page counts say nothing about HMC).
bool shmem_huge_pages() {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (!f) return false;
  char line[256] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  return read && !std::strstr(line, "[never]") && !std::strstr(line, "[deny]") && !std::strstr(line, "[advise]");
}

// Small collectives commit only the pages they touch: after a few of them, at most 4 of
// this rank's segment's 257 pages are resident (mincore), not the whole 1 MiB.
int check_lazy_pages(RankEnv& e) {
  for (int k = 0; k < 4; ++k) {
    int32_t v = e.rank;
    HMC_EXPECT_OK(all_reduce(e.comm, &v, &v, 1, DataType::kInt32, ReduceOp::kSum).wait(kWait));
  }
  const auto& segs = e.comm.impl().segments();
  HMC_EXPECT(segs != nullptr, "no segments");
  if (shmem_huge_pages()) {
    std::fprintf(stderr, "rank %d: shared memory may use huge pages here; page count not checked\n", e.rank);
    return 0;
  }
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((core::HostSegments::kBytes + page - 1) / page);
  HMC_EXPECT(mincore(segs->of(e.rank), core::HostSegments::kBytes, resident.data()) == 0, "mincore failed");
  std::size_t in_memory = 0;
  for (unsigned char r : resident) in_memory += r & 1;
  HMC_EXPECT(in_memory <= 4, std::to_string(in_memory) + " of " + std::to_string(resident.size()) + " pages resident");
  return 0;
}

// With HMC_SHM_COLL_MAX=4K, a 12-byte all_reduce takes one sequence number of the segments
// and one of 1.2 MB none (it goes through messages), and both are right. No vendor
// library (the fake one in collectives.ccl-fake) takes them first.
int check_limit(RankEnv& e) {
  const int n = e.size;
  auto& seq = coll::comm_state(e.comm.impl()).shm->next;
  for (std::size_t count : {std::size_t{3}, std::size_t{300000}}) {
    std::vector<int32_t> v(count, e.rank + 1);
    const uint64_t before = seq.load();
    HMC_EXPECT_OK(all_reduce(e.comm, v.data(), v.data(), count, DataType::kInt32, ReduceOp::kSum).wait(kWait));
    const uint64_t used = seq.load() - before;
    HMC_EXPECT(used == (count == 3 ? 1u : 0u), std::to_string(count) + " elements took " + std::to_string(used) + " rounds");
    for (int32_t x : v) HMC_EXPECT(x == n * (n + 1) / 2, "all_reduce of " + std::to_string(count));
  }
  return 0;
}

void run(int ranks, bool on, int (*body)(RankEnv&, bool), std::map<std::string, std::string> env = {}) {
  auto s = shm(on);
  s.insert(env.begin(), env.end());
  auto exits = test::run_ranks(ranks, s, [on, body](RankEnv& e) { return body(e, on); });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

}  // namespace

TEST_CASE("small collectives over shared segments are exact with several in flight", "[collectives][shm]") {
  for (int n = 2; n <= 4; ++n) {
    DYNAMIC_SECTION(n << " ranks") { run(n, true, check_rounds); }
  }
}

TEST_CASE("collectives of several rounds over shared segments are exact, in place and not", "[collectives][shm]") {
  for (int n = 2; n <= 4; ++n) {
    DYNAMIC_SECTION(n << " ranks") {
      run(n, true, [](RankEnv& e, bool) {
        if (int rc = check_large(e)) return rc;
        return check_large_rooted(e);
      });
    }
  }
}

TEST_CASE("small collectives stay exact on messages with HMC_SHM_COLL=0", "[collectives][shm]") {
  run(3, false, check_rounds);
}

TEST_CASE("HMC_SHM_COLL_MAX keeps larger collectives on messages", "[collectives][shm]") {
  run(3, true, [](RankEnv& e, bool) { return check_limit(e); }, {{"HMC_SHM_COLL_MAX", "4K"}, {"HMC_CCL", "off"}});
}

TEST_CASE("a barrier over shared segments holds every rank until the last arrives", "[collectives][shm]") {
  for (int n : {2, 3}) {
    DYNAMIC_SECTION(n << " ranks") {
      run(n, true, [](RankEnv& e, bool) { return check_barrier(e); }, {{"HMC_CCL", "off"}});
    }
  }
}

// [timing]: CTest runs it alone (tests/integration/CMakeLists.txt); two other multi-process
// tests on the 2 cores stretched the wake-ups to milliseconds.
TEST_CASE("a waiter asleep on the segments wakes when the late rank writes", "[collectives][shm][timing]") {
  run(2, true, [](RankEnv& e, bool) { return check_bell(e); }, {{"HMC_CCL", "off"}});
}

TEST_CASE("small collectives commit only the segment pages they touch", "[collectives][shm]") {
  run(2, true, [](RankEnv& e, bool) { return check_lazy_pages(e); }, {{"HMC_CCL", "off"}});
}

TEST_CASE("all_gather and all_to_all of 2 ranks from 32 KiB read the other rank's buffer directly", "[collectives][shm]") {
  run(2, true, [](RankEnv& e, bool) { return check_cma_direct(e); }, {{"HMC_CCL", "off"}});
}

TEST_CASE("all_gather and all_to_all of 2 ranks with blocks past 2 GiB read them whole", "[collectives][shm][bigmem]") {
  if (const std::size_t kb = available_kb(); kb < (std::size_t{16} << 20)) {
    WARN("skipped: needs 16 GiB of memory available, " << (kb >> 10) << " MiB here");
    return;
  }
  run(2, true, [](RankEnv& e, bool) { return check_cma_large(e); }, {{"HMC_CCL", "off"}, {"HMC_TIMEOUT", "300s"}});
}

// Many collectives in flight on two communicators at once, each over its own segments: the
// driver runs each communicator's in line and skips the rest of a line whose first waits
// (driver.cpp). Every result must still be exact, in both lines, in any order of waits.
TEST_CASE("collectives of two communicators in flight at once, hundreds each, are exact", "[collectives][shm]") {
  run(2, true, [](RankEnv& e, bool) -> int {
    auto sub = split(e.ctx, e.comm, 0, -e.rank);  // the other order: sub-rank 0 is rank 1
    HMC_EXPECT(sub.ok(), sub.status().to_string());
    HMC_EXPECT(sub->impl().segments() != nullptr, "no segments for the split");
    constexpr int kEach = 400;
    std::vector<int64_t> in(2 * kEach), out(2 * kEach, -1);
    std::vector<Request> reqs;
    for (int k = 0; k < kEach; ++k)
      for (int c = 0; c < 2; ++c) {
        const int i = 2 * k + c;
        in[i] = (e.rank + 1) * 1000 + i;
        reqs.push_back(all_reduce(c == 0 ? e.comm : sub.value(), &in[i], &out[i], 1, DataType::kInt64, ReduceOp::kSum));
      }
    for (int i = static_cast<int>(reqs.size()) - 1; i >= 0; --i) HMC_EXPECT_OK(reqs[i].wait(kWait));  // last first
    for (int i = 0; i < 2 * kEach; ++i) HMC_EXPECT(out[i] == 3000 + 2 * i, "result " + std::to_string(i));
    // Not destroyed unfinalized: its abort would close the connections while the other rank
    // still finishes its last calls, which then fail with the peer lost (seen over ucx).
    HMC_EXPECT_OK(sub->finalize());
    return 0;
  }, {{"HMC_CCL", "off"}});
}

// Rank 0's reduce is refused by its own checks (no receive buffer at the root) and rank 1's
// runs: from there the ranks' rounds of the shared segments are out of line. No later call
// may then succeed with another call's data (each all_reduce sums 3 and 4): each fails,
// with kMismatch where a rank saw the other's round, or kTimeout where it waited behind
// the call that failed so.
TEST_CASE("a collective refused on one rank alone leaves no later one reading another's data", "[collectives][shm]") {
  auto exits = test::run_ranks(2, {{"HMC_TIMEOUT", "3s"}, {"HMC_SHM_COLL", "1"}, {"HMC_CCL", "off"}}, [](RankEnv& e) {
    HMC_EXPECT(e.comm.impl().segments() != nullptr, "no shared segments");
    float a[4] = {1, 1, 1, 1}, b[4] = {};
    Status refused = reduce(e.comm, a, e.rank == 0 ? nullptr : b, 4, DataType::kFloat32, ReduceOp::kSum, 0).wait();
    HMC_EXPECT(e.rank == 1 || refused.code() == ErrorCode::kInvalidArgument, refused.to_string());
    // Rank 1's reduce met rank 0's next call in the round it took.
    HMC_EXPECT(e.rank == 0 || refused.code() == ErrorCode::kMismatch, refused.to_string());
    int mismatches = e.rank == 1;
    for (int k = 0; k < 3; ++k) {
      int32_t in[4], out[4] = {};
      std::fill(in, in + 4, 3 + e.rank);
      Status s = all_reduce(e.comm, in, out, 4, DataType::kInt32, ReduceOp::kSum).wait(std::chrono::seconds(3));
      HMC_EXPECT(!s.ok() || (out[0] == 7 && out[3] == 7), "all_reduce " + std::to_string(k) + " succeeded with " +
                                                              std::to_string(out[0]));
      if (s.code() == ErrorCode::kMismatch) {
        HMC_EXPECT(s.message().find("out of line") != std::string::npos, s.to_string());
        ++mismatches;
      }
    }
    HMC_EXPECT(mismatches > 0, "rank " + std::to_string(e.rank) + " saw no mismatch");
    e.comm.abort();
    return 0;
  }, std::chrono::seconds(60));
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// Once abort() returns nothing touches a collective's buffers (collectives.h), the ones over
// shared segments included, whose rounds no message of the communicator carries. Rank 0
// publishes its first rounds of an in-place 8 MiB all_reduce; rank 1 joins while rank 0
// runs no progress pass, and publishes its own. Rank 0 then aborts, marks its buffer and
// waits on another communicator (passes run): before, its next pass reduced rank 1's
// round into the buffer.
TEST_CASE("abort ends a collective over shared segments before the other rank's rounds reach its buffer",
          "[collectives][shm][errors]") {
  auto exits = test::run_ranks(2, {{"HMC_TIMEOUT", "20s"}, {"HMC_SHM_COLL", "1"}, {"HMC_CCL", "off"}}, [](RankEnv& e) {
    auto sub = split(e.ctx, e.comm, 0, 0);
    HMC_EXPECT(sub.ok(), sub.status().to_string());
    Communicator mine = std::move(sub.value());
    HMC_EXPECT(mine.impl().segments() != nullptr, "no shared segments for the split");
    HMC_EXPECT_OK(mine.barrier());
    std::vector<float> buf(std::size_t{2} << 20, 1.f + static_cast<float>(e.rank));
    char word = 1;
    if (e.rank == 0) {
      Request r = all_reduce(mine, buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      HMC_EXPECT_OK(e.comm.send(&word, 1, 1, 5));  // rank 1: join
      usleep(500000);                               // while rank 1 publishes its rounds
      mine.abort();  // (no test() of r first: it would run a pass before the mark)
      std::memset(buf.data(), 0xab, buf.size() * sizeof(float));
      HMC_EXPECT_OK(e.comm.recv(&word, 1, 1, 6));  // progress passes until rank 1 gave up
      const auto* bytes = reinterpret_cast<const unsigned char*>(buf.data());
      for (std::size_t i = 0; i < buf.size() * sizeof(float); ++i)
        HMC_EXPECT(bytes[i] == 0xab, "byte " + std::to_string(i) + " written after abort()");
      HMC_EXPECT(r.test() && r.status().code() == ErrorCode::kAborted, "after abort(): " + r.status().to_string());
    } else {
      HMC_EXPECT_OK(e.comm.recv(&word, 1, 0, 5));
      Status st = all_reduce(mine, buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)
                      .wait(std::chrono::seconds(2));
      HMC_EXPECT(!st.ok(), "the all_reduce finished without rank 0");
      mine.abort();
      HMC_EXPECT_OK(e.comm.send(&word, 1, 0, 6));
    }
    return 0;
  }, std::chrono::seconds(60));
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}
