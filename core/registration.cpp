#include "core/registration.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "core/log.h"

namespace hmc::core {
namespace {

constexpr uint32_t kKeyMagic = 0x4b524d48;  // "HMRK"
constexpr uint32_t kKeyVersion = 1;

template <class T>
void put_raw(std::vector<uint8_t>& out, T v) {
  auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

struct Reader {
  std::span<const uint8_t> b;
  std::size_t at = 0;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (at + sizeof(T) > b.size()) { ok = false; return v; }
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::span<const uint8_t> bytes(std::size_t n) {
    if (at + n > b.size()) { ok = false; return {}; }
    auto v = b.subspan(at, n);
    at += n;
    return v;
  }
};

// Walks `count` entries; calls visit(name, key) for each until it returns true. False when
// the entries are cut short.
template <class Visit>
bool walk_entries(std::span<const uint8_t> entries, uint32_t count, Visit visit) {
  Reader r{entries};
  for (uint32_t i = 0; i < count; ++i) {
    auto name = r.bytes(r.get<uint8_t>());
    auto key = r.bytes(r.get<uint16_t>());
    if (!r.ok) return false;
    if (visit(std::string_view(reinterpret_cast<const char*>(name.data()), name.size()), key)) return true;
  }
  return true;
}

// This process's live registrations by id, for puts through a "self" entry. A self put
// copies under `mu`, so the region it checks cannot be destroyed meanwhile.
struct LiveRegions {
  std::mutex mu;
  uint64_t next = 1;
  std::map<uint64_t, std::pair<void*, std::size_t>> regions;
};

LiveRegions& live_regions() {
  static LiveRegions* live = new LiveRegions;  // never destroyed: registrations may outlive statics
  return *live;
}

}  // namespace

Registration::Registration(void* ptr, std::size_t bytes) : ptr_(ptr), bytes_(bytes) {
  LiveRegions& live = live_regions();
  std::lock_guard lock(live.mu);
  id_ = live.next++;
  live.regions[id_] = {ptr, bytes};
}

Status self_put(std::span<const uint8_t> self_entry, uint64_t offset, const void* src, std::size_t bytes,
                const std::function<Status(void*, const void*, std::size_t)>& copy) {
  int64_t pid = 0;
  uint64_t addr = 0, id = 0;
  if (self_entry.size() != 24) return {ErrorCode::kInvalidArgument, "remote key has no valid local entry"};
  std::memcpy(&pid, self_entry.data(), 8);
  std::memcpy(&addr, self_entry.data() + 8, 8);
  std::memcpy(&id, self_entry.data() + 16, 8);
  if (pid != getpid()) return {ErrorCode::kInvalidArgument, "remote key belongs to another process, not this rank"};
  LiveRegions& live = live_regions();
  std::lock_guard lock(live.mu);
  auto it = live.regions.find(id);
  if (it == live.regions.end() || reinterpret_cast<uintptr_t>(it->second.first) != addr)
    return {ErrorCode::kInvalidArgument, "remote key of a region that is no longer registered"};
  if (offset > it->second.second || bytes > it->second.second - offset)
    return {ErrorCode::kOutOfBounds, "put overruns the region"};
  return bytes ? copy(static_cast<uint8_t*>(it->second.first) + offset, src, bytes) : Status{};
}

Registration::~Registration() {
  {
    LiveRegions& live = live_regions();
    std::lock_guard lock(live.mu);
    live.regions.erase(id_);
  }
  for (auto& e : entries_)
    if (e.net->net->dereg_mem(e.net->state, e.mr) != 0)
      HMC_LOG("core", warn, "deregistering memory from {} failed", e.net->name);
}

Status Registration::add(LoadedProvider* net, int mem_kind) {
  Entry e{net, nullptr, std::vector<uint8_t>(HMC_NET_RKEY_MAX)};
  int rc = net->net->reg_mem(net->state, ptr_, bytes_, mem_kind, &e.mr);
  if (rc != 0) return {ErrorCode::kInternal, "registering " + std::to_string(bytes_) + " bytes with " + net->name + " failed: " + provider_error_name(rc)};
  std::size_t len = 0;
  rc = net->net->pack_rkey(net->state, e.mr, e.rkey.data(), e.rkey.size(), &len);
  if (rc != 0 || len > HMC_NET_RKEY_MAX) {
    net->net->dereg_mem(net->state, e.mr);
    return {ErrorCode::kInternal, "packing the remote key of " + net->name + " failed"};
  }
  e.rkey.resize(len);
  entries_.push_back(std::move(e));
  return {};
}

std::vector<uint8_t> Registration::pack() const {
  std::vector<uint8_t> out;
  put_raw(out, kKeyMagic);
  put_raw(out, kKeyVersion);
  put_raw<uint64_t>(out, bytes_);
  put_raw<uint32_t>(out, static_cast<uint32_t>(entries_.size() + 1));
  auto add = [&](const std::string& name, const std::vector<uint8_t>& key) {
    put_raw<uint8_t>(out, static_cast<uint8_t>(name.size()));
    out.insert(out.end(), name.begin(), name.end());
    put_raw<uint16_t>(out, static_cast<uint16_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
  };
  std::vector<uint8_t> self;
  put_raw<int64_t>(self, getpid());
  put_raw<uint64_t>(self, reinterpret_cast<uintptr_t>(ptr_));
  put_raw<uint64_t>(self, id_);
  add("self", self);
  for (const auto& e : entries_) add(e.net->name, e.rkey);
  return out;
}

std::optional<std::span<const uint8_t>> UnpackedKey::find(std::string_view name) const {
  std::optional<std::span<const uint8_t>> found;
  walk_entries(entries_, count_, [&](std::string_view n, std::span<const uint8_t> key) {
    if (n == name) found = key;
    return found.has_value();
  });
  return found;
}

Result<UnpackedKey> unpack_key(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  UnpackedKey k;
  uint32_t magic = r.get<uint32_t>();
  uint32_t version = r.get<uint32_t>();
  k.region_bytes = r.get<uint64_t>();
  k.count_ = r.get<uint32_t>();
  if (!r.ok || magic != kKeyMagic || version != kKeyVersion || k.count_ > 64)
    return Status(ErrorCode::kInvalidArgument, "not an HMC remote key (MemoryRegion::pack makes them)");
  k.entries_ = std::span<const uint8_t>(bytes).subspan(r.at);
  if (!walk_entries(k.entries_, k.count_, [](std::string_view, std::span<const uint8_t>) { return false; }))
    return Status(ErrorCode::kInvalidArgument, "truncated remote key");
  return k;
}

}  // namespace hmc::core
