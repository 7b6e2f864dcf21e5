// Memory: registration (reg_mem), memory the provider allocates (mem_alloc),
// and the remote keys of both.
//
// A region is what the host registered: a range and the key handed out for
// it. Its pages are described to UCP by a Mapping (ucp_mem_map). reg_mem of
// caller memory maps it (UCP_MEM_MAP_PARAM_FIELD_ADDRESS); mem_alloc has UCP
// allocate (UCP_MEM_MAP_ALLOCATE), which over shared memory is a posix or
// sysv segment that peers map on rkey unpack, so a put into it is a memcpy by
// the initiator. Registering caller memory gives no such thing: posix and sysv
// cannot map it, and without cma UCX emulates the put with active-message
// fragments the target copies out. So reg_mem of a range inside memory from
// mem_alloc reuses that allocation's mapping (and its packed rkey) instead of
// mapping again; mappings are shared, and freed with the last user.
#include <cstring>
#include <random>

#include "provider.h"

namespace hmc_ucx {

namespace {

constexpr uint32_t kKeyMagic = 0x31584355;  // "UCX1"
constexpr uint16_t kKeyVersion = 1;

void* handle_of(uint64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }
uint64_t id_of(void* handle) { return reinterpret_cast<uintptr_t>(handle); }

uint64_t nonce() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

int from_ucs(ucs_status_t s) { return s == UCS_ERR_NO_MEMORY ? HMC_PROV_ERR_NO_MEMORY : HMC_PROV_ERR_INTERNAL; }

}  // namespace

bool parse_key(const void* blob, size_t len, KeyHead& head) {
  if (blob == nullptr || len < sizeof(KeyHead) || len > HMC_NET_RKEY_MAX) return false;
  std::memcpy(&head, blob, sizeof(head));
  return head.magic == kKeyMagic && head.version == kKeyVersion &&
         head.ucx_len == len - sizeof(KeyHead);
}

// Maps [ptr, ptr+bytes), or allocates `bytes` when ptr is null, and packs its rkey. Under mu_.
int Provider::map(void* ptr, size_t bytes, std::shared_ptr<Mapping>& out) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = ptr;
  p.length = bytes;
  if (ptr == nullptr) {
    p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.flags = UCP_MEM_MAP_ALLOCATE;
  }
  ucp_mem_h mem = nullptr;
  if (ucs_status_t s = ucp_mem_map(context_, &p, &mem); s != UCS_OK) {
    host_.log(HMC_LOG_WARN, std::string("ucp_mem_map of ") + std::to_string(bytes) + " bytes" +
                                (ptr == nullptr ? " (allocate)" : "") + ": " + ucs_status_string(s));
    return from_ucs(s);
  }
  auto m = std::make_shared<Mapping>(context_, mem);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(mem, &attr); s != UCS_OK) {
    host_.log(HMC_LOG_WARN, std::string("ucp_mem_query: ") + ucs_status_string(s));
    return from_ucs(s);
  }
  m->base = static_cast<char*>(attr.address);
  m->len = attr.length;
  void* rkey = nullptr;
  size_t rkey_len = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, mem, &rkey, &rkey_len); s != UCS_OK) {
    host_.log(HMC_LOG_WARN, std::string("ucp_rkey_pack: ") + ucs_status_string(s));
    return from_ucs(s);
  }
  m->packed.assign(static_cast<char*>(rkey), rkey_len);
  ucp_rkey_buffer_release(rkey);
  if (m->packed.size() > HMC_NET_RKEY_MAX - sizeof(KeyHead)) {
    host_.log(HMC_LOG_WARN, "ucp packed an rkey of " + std::to_string(m->packed.size()) +
                                " bytes; HMC_NET_RKEY_MAX leaves room for " +
                                std::to_string(HMC_NET_RKEY_MAX - sizeof(KeyHead)) + " (UCX transports: " +
                                transports_ + ")");
    return HMC_PROV_ERR_UNSUPPORTED;
  }
  out = std::move(m);
  return HMC_PROV_OK;
}

// A new region of [base, base+len) over `mapping`; returns its handle. Under mu_.
void* Provider::add_region(char* base, size_t len, std::shared_ptr<Mapping> mapping) {
  auto r = std::make_unique<Region>();
  r->id = next_region_++;
  r->nonce = nonce();
  r->base = base;
  r->len = len;
  const std::string packed = mapping ? mapping->packed : std::string();
  r->mapping = std::move(mapping);
  KeyHead head{kKeyMagic, kKeyVersion, static_cast<uint16_t>(packed.size()), r->id, r->nonce,
               reinterpret_cast<uintptr_t>(base), len};
  r->key.assign(reinterpret_cast<const char*>(&head), sizeof(head));
  r->key += packed;
  void* handle = handle_of(r->id);
  regions_.emplace(r->id, std::move(r));
  return handle;
}

// Revokes the region's key on every connection that verified it and forgets it. Under mu_.
// Puts that arrive from now on find no region and are refused; active-message puts already
// landing here (put.cpp) finish first, the region and its mapping kept until then: UCP
// cannot cancel them, and the memory may be freed once we return. So do the copies of peers
// that put through a mapping (Region::mapped_by): each answers the revoke (kRevoked) once
// none is under way.
void Provider::drop_region(std::unique_lock<std::mutex>& lock, uint64_t id) {
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  std::unique_ptr<Region> gone = std::move(it->second);
  regions_.erase(it);
  for (uint32_t conn : gone->verified) {
    auto c = conns_.find(conn);
    if (c == conns_.end() || !c->second->carries()) continue;
    const bool copies = gone->mapped_by.contains(conn);
    send_control(*c->second, Kind::kRevoke, gone->id, gone->nonce, copies ? 1 : 0, {});
    if (copies) c->second->owe_revoked.insert(gone->id);
  }
  auto owed = [&] {
    for (const auto& [cid, c] : conns_)
      if (c->carries() && c->owe_revoked.contains(id)) return true;
    return false;
  };
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::seconds(10);
  while ((landing(id) || owed()) && Clock::now() < deadline) look(lock, started);
  if (landing(id) || owed())
    host_.log(HMC_LOG_WARN, "dereg_mem: a peer's put into the region is still arriving after 10 s");
  for (auto& [cid, c] : conns_) c->owe_revoked.erase(id);  // an answer that never came
}

// The mapping of the mem_alloc allocation holding [ptr, ptr+bytes), or null. Under mu_.
std::shared_ptr<Mapping> Provider::allocation_of(const char* ptr, size_t bytes) const {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations_.upper_bound(addr);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Mapping& m = *it->second;
  return addr + bytes <= it->first + m.len ? it->second : nullptr;
}

int Provider::reg_mem(void* ptr, size_t bytes, int mem_kind, void** mr) {
  if (mem_kind != HMC_MEM_HOST) return HMC_PROV_ERR_UNSUPPORTED;
  if (mr == nullptr || (ptr == nullptr && bytes > 0)) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  std::shared_ptr<Mapping> mapping;
  if (bytes > 0) {
    mapping = allocation_of(static_cast<const char*>(ptr), bytes);
    if (!mapping)
      if (int rc = map(ptr, bytes, mapping)) return rc;
  }
  *mr = add_region(static_cast<char*>(ptr), bytes, std::move(mapping));
  return HMC_PROV_OK;
}

int Provider::dereg_mem(void* mr) {
  std::unique_lock lock(mu_);
  if (!regions_.contains(id_of(mr))) return HMC_PROV_ERR_INVALID;
  drop_region(lock, id_of(mr));
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

int Provider::pack_rkey(void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len) {
  std::unique_lock lock(mu_);
  auto it = regions_.find(id_of(mr));
  if (it == regions_.end()) return HMC_PROV_ERR_INVALID;
  const std::string& key = it->second->key;
  if (rkey_len != nullptr) *rkey_len = key.size();
  if (rkey == nullptr || rkey_cap < key.size()) return HMC_PROV_ERR_INVALID;
  std::memcpy(rkey, key.data(), key.size());
  return HMC_PROV_OK;
}

int Provider::mem_alloc(size_t bytes, void** ptr, void** mr) {
  if (bytes == 0 || ptr == nullptr || mr == nullptr) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  std::shared_ptr<Mapping> mapping;
  if (int rc = map(nullptr, bytes, mapping)) return rc;
  allocations_.emplace(reinterpret_cast<uintptr_t>(mapping->base), mapping);
  *ptr = mapping->base;
  *mr = add_region(mapping->base, bytes, mapping);
  return HMC_PROV_OK;
}

int Provider::mem_free(void* ptr, void* mr) {
  std::unique_lock lock(mu_);
  auto a = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  auto r = regions_.find(id_of(mr));
  if (a == allocations_.end() || r == regions_.end() || r->second->mapping != a->second)
    return HMC_PROV_ERR_INVALID;
  allocations_.erase(a);  // the pages stay while a region still uses them
  drop_region(lock, id_of(mr));
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

}  // namespace hmc_ucx
