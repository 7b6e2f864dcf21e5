// Registration: memory registered with every net provider that can put into it.
//
// Packed remote key layout (little-endian, opaque to users):
//   u32 magic "HMRK", u32 version, u64 region bytes, u32 entries,
//   then per entry: u8 name length, name, u16 key length, key.
// The "self" entry holds {pid, address} for puts within one process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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

struct UnpackedKey {
  uint64_t region_bytes = 0;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> entries;
  const std::vector<uint8_t>* find(const std::string& name) const;
};
Result<UnpackedKey> unpack_key(const std::vector<uint8_t>& bytes);

}  // namespace hmc::core
