// Registration: memory registered with every net provider that can put into it.
//
// Packed remote key layout (little-endian, opaque to users):
//   u32 magic "HMRK", u32 version, u64 region bytes, u32 entries,
//   then per entry: u8 name length, name, u16 key length, key.
// The "self" entry holds {pid, address, region id} for puts within one process; the id
// names the Registration while it lives (self_put checks it), so a key of a region since
// destroyed, or a forged one, writes nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/plugin_registry.h"
#include "hmc/memory_region.h"

namespace hmc::core {

class Registration {
 public:
  Registration(void* ptr, std::size_t bytes);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  Status add(LoadedProvider* net, int mem_kind);
  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  std::vector<uint8_t> pack() const;

 private:
  struct Entry {
    LoadedProvider* net;
    void* mr;
    std::vector<uint8_t> rkey;
  };
  void* ptr_;
  std::size_t bytes_;
  uint64_t id_;  // in this process's table of live registrations (registration.cpp)
  std::vector<Entry> entries_;
};

// A put within this process through a key's "self" entry: copies `bytes` from `src` at
// `offset` of the region with `copy`, while the region cannot be destroyed; fails where the
// key is not this process's or its region is gone.
Status self_put(std::span<const uint8_t> self_entry, uint64_t offset, const void* src, std::size_t bytes,
                const std::function<Status(void* dst, const void* src, std::size_t bytes)>& copy);

// A packed key, checked and read in place: find() returns a view into the bytes it was
// unpacked from, which must outlive it. A put unpacks its key on every call, so nothing
// is copied or allocated here.
class UnpackedKey {
 public:
  uint64_t region_bytes = 0;
  // The entry of provider `name` ("self" for the same process), or nullopt.
  std::optional<std::span<const uint8_t>> find(std::string_view name) const;

 private:
  friend Result<UnpackedKey> unpack_key(const std::vector<uint8_t>& bytes);
  std::span<const uint8_t> entries_;  // the entries, after the header
  uint32_t count_ = 0;
};
Result<UnpackedKey> unpack_key(const std::vector<uint8_t>& bytes);
// The result would point into a temporary: keep the packed bytes in a variable.
Result<UnpackedKey> unpack_key(std::vector<uint8_t>&& bytes) = delete;

}  // namespace hmc::core
