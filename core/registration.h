// Registration: memory registered with every net provider that can put into it.
//
// Packed remote key layout (little-endian, opaque to users):
//   u32 magic "HMRK", u32 version, u64 region bytes, u32 entries,
//   then per entry: u8 name length, name, u16 key length, key.
// The "self" entry holds {pid, address} for puts within one process.
#pragma once

#include <cstdint>
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
  Registration(void* ptr, std::size_t bytes) : ptr_(ptr), bytes_(bytes) {}
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
  std::vector<Entry> entries_;
};

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
