#include "common/msg_ring.h"

#include "common/host.h"
#include "common/sealed_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace hmc_net {

namespace {

constexpr uint32_t kRingMagic = 0x474e5248;  // "HRNG"
constexpr uint32_t kRingVersion = 3;  // 2: messages, put_region; 3: nonce
constexpr uint64_t kAlign = 16;
constexpr uint64_t kDataOffset = (sizeof(RingControl) + 63) / 64 * 64;
// A record is worth writing when it carries the whole rest or at least this much.
constexpr uint64_t kMinFragment = 4096;
constexpr uint64_t kMinCapacity = 64 * 1024;

uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

SharedRing::SharedRing(int fd, void* base, size_t bytes)
    : fd_(fd),
      base_(base),
      bytes_(bytes),
      ctl_(static_cast<RingControl*>(base)),
      data_(static_cast<char*>(base) + kDataOffset),
      // From the mapping's size, not from the control block: a peer's ring is checked
      // once (map), and the peer could change the word after that check.
      cap_(bytes - kDataOffset) {}

SharedRing::~SharedRing() {
  munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

std::unique_ptr<SharedRing> SharedRing::create(size_t capacity, bool messages, std::string& why) {
  const uint64_t cap = std::bit_ceil(std::max<uint64_t>(capacity, kMinCapacity));
  const size_t bytes = kDataOffset + cap;
  const int fd = create_sealed_memfd("hmc-ring", bytes, why);
  if (fd < 0) {
    why = "a message ring: " + why;
    return nullptr;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    why = std::string("mmap of a message ring: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  auto* ctl = new (base) RingControl{};  // the file is zeroed: the atomics start at 0
  ctl->magic = kRingMagic;
  ctl->version = kRingVersion;
  ctl->capacity = cap;
  ctl->messages = messages ? 1 : 0;
  ctl->nonce = random_key();
  auto ring = std::unique_ptr<SharedRing>(new SharedRing(fd, base, bytes));
  ring->messages_ = messages;
  return ring;
}

std::unique_ptr<SharedRing> SharedRing::map(const std::string& path, const RingOffer& offer,
                                            std::string& why) {
  const uint64_t bytes = offer.bytes;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    why = "open " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || bytes <= kDataOffset ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    why = path + " is not a message ring of " + std::to_string(bytes) + " bytes";
  } else if (!cannot_shrink(fd)) {
    why = not_sealed(path);
  } else {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) why = "mmap of " + path + ": " + std::strerror(errno);
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  const auto* ctl = static_cast<const RingControl*>(base);
  if (ctl->magic != kRingMagic || ctl->version != kRingVersion ||
      !std::has_single_bit(ctl->capacity) || ctl->capacity < kMinCapacity ||
      ctl->capacity != bytes - kDataOffset) {
    why = path + " holds no message ring of this version";
    munmap(base, bytes);
    return nullptr;
  }
  if (ctl->nonce != offer.nonce) {
    why = path + " holds another message ring than the one offered";
    munmap(base, bytes);
    return nullptr;
  }
  auto ring = std::unique_ptr<SharedRing>(new SharedRing(-1, base, bytes));
  ring->messages_ = ctl->messages != 0;
  return ring;
}

RingOffer SharedRing::offer() const {
  return RingOffer{fd_, bytes_, reinterpret_cast<uint64_t>(&ctl_->nonce), ctl_->nonce};
}

int64_t SharedRing::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void SharedRing::copy_in(uint64_t pos, const void* src, uint64_t n) {
  const uint64_t at = pos & (cap_ - 1);
  const uint64_t first = std::min(n, cap_ - at);
  std::memcpy(data_ + at, src, first);
  if (first < n) std::memcpy(data_, static_cast<const char*>(src) + first, n - first);
}

void SharedRing::copy(uint64_t from, char* dst, uint64_t n) const {
  if (n == 0) return;  // dst may be null then
  const uint64_t at = (pos_ + sizeof(RingRecord) + from) & (cap_ - 1);
  const uint64_t first = std::min(n, cap_ - at);
  std::memcpy(dst, data_ + at, first);
  if (first < n) std::memcpy(dst + first, data_, n - first);
}

bool SharedRing::write(const char* msg, uint64_t total, uint64_t& done) {
  const uint64_t used = pos_ - ctl_->head.load(std::memory_order_acquire);
  // A garbled head (used > cap_) writes nothing: the message waits, and its send with it,
  // until the connection ends. Only a broken peer garbles it.
  if (used > cap_ || cap_ - used < sizeof(RingRecord)) return false;
  const uint64_t rest = total - done;
  const uint64_t n = std::min(rest, cap_ - used - sizeof(RingRecord));
  if (n < rest && n < kMinFragment) return false;
  RingRecord rec{static_cast<uint32_t>(n), done == 0 ? kRingFirst : 0u, total};
  copy_in(pos_, &rec, sizeof(rec));
  if (n > 0) copy_in(pos_ + sizeof(rec), msg + done, n);
  pos_ += aligned(sizeof(rec) + n);
  ctl_->tail.store(pos_, std::memory_order_release);
  done += n;
  return true;
}

bool SharedRing::ask_space() {
  ctl_->want_space.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t used = pos_ - ctl_->head.load(std::memory_order_relaxed);
  return used <= cap_ && cap_ - used >= sizeof(RingRecord) + kMinFragment;
}

bool SharedRing::reader_idle(int64_t now_ns) const {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const int64_t age = now_ns - ctl_->poll_ns.load(std::memory_order_relaxed);
  return age < 0 || age > kIdleNs;
}

bool SharedRing::next(RingRecord& rec, std::string& why) {
  const uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
  const uint64_t avail = tail - pos_;
  if (avail == 0) return false;
  if (avail > cap_ || avail < sizeof(RingRecord) || (tail & (kAlign - 1)) != 0) {
    why = "message ring: tail " + std::to_string(tail) + " against head " + std::to_string(pos_);
    return false;
  }
  std::memcpy(&rec, data_ + (pos_ & (cap_ - 1)), sizeof(rec));  // 16-aligned: never wraps
  if (rec.len > avail - sizeof(RingRecord)) {
    why = "message ring: a record of " + std::to_string(rec.len) + " bytes overruns the tail";
    return false;
  }
  return true;
}

bool SharedRing::consume(const RingRecord& rec) {
  pos_ += aligned(sizeof(RingRecord) + rec.len);
  ctl_->head.store(pos_, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl_->want_space.load(std::memory_order_relaxed) == 0) return false;
  return ctl_->want_space.exchange(0, std::memory_order_relaxed) != 0;
}

}  // namespace hmc_net
