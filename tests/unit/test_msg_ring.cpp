// The shared-memory message ring of the stream providers (net-providers/common/msg_ring.h):
// a writer and a reader thread, each with its own mapping of one memfd, as two processes
// would have.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/msg_ring.h"

using hmc_net::RingRecord;
using hmc_net::SharedRing;

namespace {

std::unique_ptr<SharedRing> map_of(const SharedRing& ring) {
  const hmc_net::RingOffer offer = ring.offer();
  std::string why;
  auto mapped = SharedRing::map("/proc/self/fd/" + std::to_string(offer.fd), offer.bytes, why);
  INFO(why);
  REQUIRE(mapped != nullptr);
  return mapped;
}

std::vector<char> random_message(std::mt19937_64& rng, size_t max) {
  std::vector<char> m(rng() % (max + 1));
  for (char& c : m) c = static_cast<char>(rng());
  return m;
}

}  // namespace

TEST_CASE("message ring: messages of any size arrive whole and in order", "[ring]") {
  std::string why;
  auto reader = SharedRing::create(64 << 10, why);
  REQUIRE(reader != nullptr);
  auto writer = map_of(*reader);
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  // Mostly small messages, some several times the ring, some empty.
  std::mt19937_64 rng(seed);
  std::vector<std::vector<char>> sent;
  for (int i = 0; i < 400; ++i) sent.push_back(random_message(rng, i % 10 == 0 ? 300 << 10 : 200));

  std::thread producer([&] {
    for (const auto& m : sent) {
      uint64_t done = 0;
      bool started = false;
      while (!started || done < m.size()) {
        if (writer->write(m.data(), m.size(), done)) {
          started = true;
        } else if (!writer->ask_space()) {
          std::this_thread::yield();
        }
      }
    }
  });
  size_t bells = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    std::vector<char> got;
    uint64_t total = 0;
    bool first = true;
    while (first || got.size() < total) {
      RingRecord rec{};
      if (!reader->next(rec, why)) {
        REQUIRE(why.empty());
        std::this_thread::yield();
        continue;
      }
      REQUIRE(((rec.flags & hmc_net::kRingFirst) != 0) == first);
      if (first) total = rec.total;
      first = false;
      const size_t at = got.size();
      REQUIRE(rec.len <= total - at);
      got.resize(at + rec.len, '\x5a');
      reader->copy(0, got.data() + at, rec.len);
      bells += reader->consume(rec) ? 1 : 0;
    }
    INFO("message " << i);
    REQUIRE(got == sent[i]);
  }
  producer.join();
  RingRecord rec{};
  CHECK_FALSE(reader->next(rec, why));
  CHECK(why.empty());
  CHECK(bells > 0);  // the 300 KiB messages filled the 64 KiB ring
}

TEST_CASE("message ring: the reader refuses what a broken writer left", "[ring]") {
  std::string why;
  auto reader = SharedRing::create(64 << 10, why);
  REQUIRE(reader != nullptr);
  auto writer = map_of(*reader);
  const char msg[] = "hello";
  uint64_t done = 0;
  REQUIRE(writer->write(msg, sizeof(msg), done));
  REQUIRE(done == sizeof(msg));

  RingRecord rec{};
  SECTION("a tail beyond the capacity") {
    reader->control().tail.store(uint64_t{1} << 40);
    CHECK_FALSE(reader->next(rec, why));
    CHECK(why.find("tail") != std::string::npos);
  }
  SECTION("a tail that is not record-aligned") {
    reader->control().tail.store(17);
    CHECK_FALSE(reader->next(rec, why));
    CHECK_FALSE(why.empty());
  }
  SECTION("a record longer than what was written") {
    RingRecord bad{1000, hmc_net::kRingFirst, 1000};
    // The data area follows the control block, 64-byte aligned.
    char* data = reinterpret_cast<char*>(&reader->control()) + (sizeof(hmc_net::RingControl) + 63) / 64 * 64;
    std::memcpy(data, &bad, sizeof(bad));
    CHECK_FALSE(reader->next(rec, why));
    CHECK(why.find("overruns") != std::string::npos);
  }
  SECTION("an intact record reads back") {
    REQUIRE(reader->next(rec, why));
    CHECK(rec.len == sizeof(msg));
    CHECK(rec.total == sizeof(msg));
    char out[sizeof(msg)] = {};
    reader->copy(0, out, rec.len);
    CHECK(std::memcmp(out, msg, sizeof(msg)) == 0);
  }
}

TEST_CASE("message ring: only a ring of this version maps; idle readers are seen", "[ring]") {
  std::string why;
  const int fd = memfd_create("not-a-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 1 << 20) == 0);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // A file its owner could still shrink is refused whatever it holds: a write through the
  // mapping after a shrink would die of SIGBUS.
  CHECK(SharedRing::map(path, 1 << 20, why) == nullptr);
  CHECK(why.find("not sealed") != std::string::npos);
  REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK(SharedRing::map(path, 1 << 20, why) == nullptr);
  CHECK(why.find("no message ring") != std::string::npos);
  CHECK(SharedRing::map(path, 4096, why) == nullptr);
  close(fd);

  auto reader = SharedRing::create(1, why);  // rounded up to the minimum
  REQUIRE(reader != nullptr);
  // The ring it offers cannot change size, so a peer may map it.
  const int offered = static_cast<int>(reader->offer().fd);
  CHECK((fcntl(offered, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
  CHECK(ftruncate(offered, 4096) != 0);
  CHECK(reader->max_record() >= (64u << 10) - sizeof(RingRecord));
  auto writer = map_of(*reader);
  const int64_t now = SharedRing::now_ns();
  CHECK(writer->reader_idle(now));  // never polled
  reader->stamp_polling(now);
  CHECK_FALSE(writer->reader_idle(now + 1000));
  CHECK(writer->reader_idle(now + 2 * SharedRing::kIdleNs));
}
