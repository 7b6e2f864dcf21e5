// Registered regions for the put and get checks of the net conformance kit: memory of
// several kinds, poisoned, with a poisoned guard past the end that is not registered.
#pragma once

#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "net_kit.h"

namespace hmc_conformance {

// Where a region's memory comes from: the heap, or shared memory the way
// HMC_ALLOC_SHAREABLE makes it (a memfd mapped MAP_SHARED, fd kept open; shm
// maps it and copies with memcpy), or that with its fd closed after reg_mem
// and the number taken by another memfd, the decoy (shm must notice that the
// fd names another file, leave the decoy alone and fall back to its other way),
// or the plugin's own mem_alloc (HMC_NET_CAP_MEM_ALLOC; the region registers a
// range inside it, which the plugin must serve from the allocation's registration),
// or a large anonymous mapping whose pages nobody touched (MAP_NORESERVE: reads give
// zeros and cost no memory; the test poisons only the bytes it checks).
enum class Mem { heap, shared, shared_fd_reused, provider, sparse };

// The kinds of memory `s` is checked with: `base`, and the plugin's own when it has it.
inline std::vector<Mem> with_provider(const Session& s, std::vector<Mem> base) {
  if (s.has(HMC_NET_CAP_MEM_ALLOC)) base.push_back(Mem::provider);
  return base;
}

inline const char* mem_name(Mem m) {
  switch (m) {
    case Mem::heap:
      return "heap memory";
    case Mem::shared:
      return "shared memory (memfd, MAP_SHARED)";
    case Mem::shared_fd_reused:
      return "shared memory whose fd now names another file";
    case Mem::provider:
      return "memory from the plugin's mem_alloc";
    case Mem::sparse:
      return "sparse anonymous memory (MAP_NORESERVE)";
  }
  return "?";
}

// A registered, poisoned region of `owner` with its packed remote key, and
// `guard` poisoned bytes past its end that are not registered.
struct Region {
  Session* owner = nullptr;
  std::vector<char> heap;
  std::unique_ptr<SharedMem> shared;
  std::unique_ptr<SharedMem> decoy;  // shared_fd_reused: holds the old fd number
  void* alloc_mr = nullptr;          // provider: mem_alloc's registration
  void* mapping = nullptr;           // sparse: the mapping, unmapped at the end
  char* base = nullptr;
  size_t len = 0;
  size_t guard = 0;
  void* mr = nullptr;
  std::vector<uint8_t> rkey;

  Region(Session& s, size_t len, Mem kind = Mem::heap, size_t guard = 0)
      : owner(&s), len(len), guard(guard) {
    if (kind == Mem::heap) {
      heap.assign(len + guard, static_cast<char>(kPoison));
      base = heap.data();
    } else if (kind == Mem::provider) {
      void* ptr = nullptr;
      REQUIRE(s.p->mem_alloc(s.state, len + guard, &ptr, &alloc_mr) == HMC_PROV_OK);
      REQUIRE(ptr != nullptr);
      base = static_cast<char*>(ptr);
      std::memset(base, kPoison, len + guard);
    } else if (kind == Mem::sparse) {
      mapping = mmap(nullptr, len + guard, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      REQUIRE(mapping != MAP_FAILED);
      base = static_cast<char*>(mapping);
    } else {
      shared = std::make_unique<SharedMem>(len + guard, kPoison);
      INFO(shared->error());
      REQUIRE(shared->data() != nullptr);
      base = shared->data();
    }
    reg();
    if (kind == Mem::shared_fd_reused) {
      shared->close_fd();
      decoy = std::make_unique<SharedMem>(len + guard, 0);
      REQUIRE(decoy->data() != nullptr);
    }
  }
  ~Region() {
    dereg();
    if (alloc_mr != nullptr) CHECK(owner->p->mem_free(owner->state, base, alloc_mr) == HMC_PROV_OK);
    if (mapping != nullptr) munmap(mapping, len + guard);
  }
  char* data() const { return base; }
  size_t size() const { return len; }
  void reg() {
    REQUIRE(owner->p->reg_mem(owner->state, base, len, HMC_MEM_HOST, &mr) == HMC_PROV_OK);
    REQUIRE(mr != nullptr);
    rkey.resize(HMC_NET_RKEY_MAX);
    size_t len_out = 0;
    REQUIRE(owner->p->pack_rkey(owner->state, mr, rkey.data(), rkey.size(), &len_out) ==
            HMC_PROV_OK);
    REQUIRE(len_out > 0);
    REQUIRE(len_out <= HMC_NET_RKEY_MAX);
    rkey.resize(len_out);
  }
  void dereg() {
    if (mr != nullptr) CHECK(owner->p->dereg_mem(owner->state, mr) == HMC_PROV_OK);
    mr = nullptr;
  }
  void poison() { std::memset(base, kPoison, len + guard); }
};

// The region holds `data` at `offset` and poison everywhere else, guard included.
inline void check_region(const Region& r, uint64_t offset, const std::vector<char>& data) {
  CHECK(first_not(r.data(), offset, kPoison) == offset);
  CHECK(first_diff(r.data() + offset, data.data(), data.size()) == data.size());
  const size_t end = offset + data.size();
  const size_t rest = r.size() + r.guard - end;
  CHECK(first_not(r.data() + end, rest, kPoison) == rest);
  if (r.decoy) CHECK(first_not(r.decoy->data(), r.decoy->size(), 0) == r.decoy->size());
}

inline bool untouched(const Region& r) {
  return first_not(r.data(), r.size() + r.guard, kPoison) == r.size() + r.guard &&
         (!r.decoy || first_not(r.decoy->data(), r.decoy->size(), 0) == r.decoy->size());
}

// `body` for every plugin with capability `cap` (`what`, for the warning where a plugin
// lacks it), on a second session of it and a connection between the two (link.a is s's end).
inline void for_each_pair_with(uint64_t cap, const char* what,
                               const std::function<void(Session&, Session&, Link&)>& body) {
  for_each_plugin([&](Session& s) {
    if (!s.has(cap)) {
      WARN(s.p->name << " lacks the capability " << what << ": " << what << " checks skipped");
      return;
    }
    Session t;
    REQUIRE(t.open(s.path));
    Link link = connect_pair(s, t);
    body(s, t, link);
  });
}

}  // namespace hmc_conformance
