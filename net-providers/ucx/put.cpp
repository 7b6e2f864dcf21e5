// Registration, remote keys and puts.
//
// The packed key is a KeyHead (region id, a random nonce, base address and
// length) followed by UCP's packed rkey. Puts are checked on the target's
// authority: before the first put with a key, the initiator sends the whole
// key and the range in a kCheck message; the target compares the key byte
// for byte with the one it handed out for that region and checks the range,
// and answers kReply. A refused put fails with HMC_PROV_ERR_OUT_OF_BOUNDS and
// no byte is written. An accepted key is kept (unpacked) per connection, so
// later puts with it are one round trip shorter, checked against the
// verified length; dereg_mem sends kRevoke on every connection that holds it,
// in sequence ahead of anything sent after, so a stale key is checked again.
//
// A put is ucp_put_nbx then ucp_ep_flush_nbx; the request completes when the
// flush does, i.e. when the data is in the target's memory. Until then later
// sends on the connection wait (Conn::held): the ordering contract.
#include <cstring>
#include <random>

#include "provider.h"

namespace hmc_ucx {

namespace {

constexpr uint32_t kKeyMagic = 0x31584355;  // "UCX1"
constexpr uint16_t kKeyVersion = 1;

struct KeyHead {
  uint32_t magic;
  uint16_t version;
  uint16_t ucx_len;
  uint64_t region, nonce, base, length;
};
static_assert(sizeof(KeyHead) == 40);

bool parse_key(const void* blob, size_t len, KeyHead& head) {
  if (blob == nullptr || len < sizeof(KeyHead) || len > HMC_NET_RKEY_MAX) return false;
  std::memcpy(&head, blob, sizeof(head));
  return head.magic == kKeyMagic && head.version == kKeyVersion &&
         head.ucx_len == len - sizeof(KeyHead);
}

void* handle_of(uint64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }
uint64_t id_of(void* handle) { return reinterpret_cast<uintptr_t>(handle); }

uint64_t nonce() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

void op_cb(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->provider->on_op_done(op, status, 0);
  ucp_request_free(request);
}

}  // namespace

int Provider::reg_mem(void* ptr, size_t bytes, int mem_kind, void** mr) {
  if (mem_kind != HMC_MEM_HOST) return HMC_PROV_ERR_UNSUPPORTED;
  if (mr == nullptr || (ptr == nullptr && bytes > 0)) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  auto r = std::make_unique<Region>();
  r->id = next_region_++;
  r->nonce = nonce();
  r->base = static_cast<char*>(ptr);
  r->len = bytes;
  std::string packed;
  if (bytes > 0) {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = ptr;
    p.length = bytes;
    if (ucs_status_t s = ucp_mem_map(context_, &p, &r->mem); s != UCS_OK) {
      host_.log(HMC_LOG_WARN, std::string("ucp_mem_map of ") + std::to_string(bytes) +
                                  " bytes: " + ucs_status_string(s));
      return s == UCS_ERR_NO_MEMORY ? HMC_PROV_ERR_NO_MEMORY : HMC_PROV_ERR_INTERNAL;
    }
    void* rkey = nullptr;
    size_t rkey_len = 0;
    if (ucs_status_t s = ucp_rkey_pack(context_, r->mem, &rkey, &rkey_len); s != UCS_OK) {
      ucp_mem_unmap(context_, r->mem);
      host_.log(HMC_LOG_WARN, std::string("ucp_rkey_pack: ") + ucs_status_string(s));
      return HMC_PROV_ERR_INTERNAL;
    }
    packed.assign(static_cast<char*>(rkey), rkey_len);
    ucp_rkey_buffer_release(rkey);
  }
  if (packed.size() > HMC_NET_RKEY_MAX - sizeof(KeyHead)) {
    ucp_mem_unmap(context_, r->mem);
    host_.log(HMC_LOG_WARN, "ucp packed an rkey of " + std::to_string(packed.size()) +
                                " bytes; HMC_NET_RKEY_MAX leaves room for " +
                                std::to_string(HMC_NET_RKEY_MAX - sizeof(KeyHead)) + " (UCX transports: " +
                                transports_ + ")");
    return HMC_PROV_ERR_UNSUPPORTED;
  }
  KeyHead head{kKeyMagic, kKeyVersion, static_cast<uint16_t>(packed.size()), r->id, r->nonce,
               reinterpret_cast<uintptr_t>(ptr), bytes};
  r->key.assign(reinterpret_cast<const char*>(&head), sizeof(head));
  r->key += packed;
  *mr = handle_of(r->id);
  regions_.emplace(r->id, std::move(r));
  return HMC_PROV_OK;
}

int Provider::dereg_mem(void* mr) {
  std::unique_lock lock(mu_);
  auto it = regions_.find(id_of(mr));
  if (it == regions_.end()) return HMC_PROV_ERR_INVALID;
  Region& r = *it->second;
  for (uint32_t id : r.verified) {
    auto c = conns_.find(id);
    if (c != conns_.end() && c->second->state == Conn::kOpen)
      send_control(*c->second, Kind::kRevoke, r.id, r.nonce, 0, {});
  }
  if (r.mem != nullptr) ucp_mem_unmap(context_, r.mem);
  regions_.erase(it);
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

int Provider::put(void* conn, const void* src, size_t len, const void* rkey, size_t rkey_len,
                  uint64_t offset, void** req) {
  if (req == nullptr || (src == nullptr && len > 0)) return HMC_PROV_ERR_INVALID;
  KeyHead head;
  if (!parse_key(rkey, rkey_len, head)) return HMC_PROV_ERR_INVALID;
  // Early refusal from the key; the target decides for keys it has not verified.
  if (offset > head.length || len > head.length - offset) return HMC_PROV_ERR_OUT_OF_BOUNDS;
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return HMC_PROV_ERR_CLOSED;
  if (c->state == Conn::kFailed) return c->error;
  if (c->state != Conn::kOpen) return HMC_PROV_ERR_INVALID;
  PendingPut p{next_put_++, requests_.create(), static_cast<const char*>(src), len, offset,
               std::string(static_cast<const char*>(rkey), rkey_len)};
  *req = p.req;
  ++c->puts;
  auto k = c->keys.find(p.key);
  if (k != c->keys.end()) {
    start_put(*c, std::move(p), k->second);
  } else {
    const uint64_t id = p.id;
    std::string key = p.key;
    c->checking.emplace(id, std::move(p));
    send_control(*c, Kind::kCheck, id, offset, len, std::move(key));
  }
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

// Target: is this key ours, live, and the range inside its region?
void Provider::on_check(Conn& c, const Wire& w, const std::string& key) {
  KeyHead head;
  std::string why;
  auto it = parse_key(key.data(), key.size(), head) ? regions_.find(head.region) : regions_.end();
  if (it == regions_.end() || it->second->key != key) {
    why = "unknown or stale remote key (region not registered here)";
  } else if (w.arg > it->second->len || w.len > it->second->len - w.arg) {
    why = "put of " + std::to_string(w.len) + " bytes at offset " + std::to_string(w.arg) +
          " leaves the " + std::to_string(it->second->len) + "-byte region";
  } else {
    it->second->verified.insert(c.id);
  }
  send_control(c, Kind::kReply, w.token, why.empty() ? 0 : 1, 0, why);
}

// Initiator: the target's verdict on a key.
void Provider::on_reply(Conn& c, const Wire& w, const std::string& why) {
  auto it = c.checking.find(w.token);
  if (it == c.checking.end()) return;
  PendingPut p = std::move(it->second);
  c.checking.erase(it);
  if (w.arg != 0) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_OUT_OF_BOUNDS, "put refused by the peer: " + why);
    return;
  }
  if (auto known = c.keys.find(p.key); known != c.keys.end()) {  // two checks of one key crossed
    start_put(c, std::move(p), known->second);
    return;
  }
  KeyHead head;
  parse_key(p.key.data(), p.key.size(), head);
  VerifiedKey k{nullptr, head.region, head.nonce, head.base};
  if (head.ucx_len > 0) {
    if (ucs_status_t s = ucp_ep_rkey_unpack(c.ep, p.key.data() + sizeof(KeyHead), &k.rkey); s != UCS_OK) {
      put_finished(c, p.req, 0, HMC_PROV_ERR_INTERNAL, std::string("ucp_ep_rkey_unpack: ") + ucs_status_string(s));
      return;
    }
  }
  auto& slot = c.keys[p.key];
  slot = k;
  start_put(c, std::move(p), slot);
}

void Provider::on_revoke(Conn& c, const Wire& w) {
  for (auto it = c.keys.begin(); it != c.keys.end();) {
    if (it->second.region != w.token || it->second.nonce != w.arg) {
      ++it;
      continue;
    }
    if (it->second.rkey != nullptr) dead_rkeys_.push_back(it->second.rkey);
    it = c.keys.erase(it);
  }
}

void Provider::start_put(Conn& c, PendingPut p, const VerifiedKey& k) {
  if (p.len == 0) {
    put_finished(c, p.req, 0, HMC_PROV_OK, {});
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = op_cb;
  auto* put = new Op(Op::kPut);
  put->provider = this;
  put->conn = &c;
  param.user_data = put;
  void* r = ucp_put_nbx(c.ep, p.src, p.len, k.base + p.offset, k.rkey, &param);
  if (UCS_PTR_IS_ERR(r)) {
    delete put;
    put_finished(c, p.req, 0, HMC_PROV_ERR_PEER_LOST,
                 std::string("ucp_put_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    return;
  }
  if (r == nullptr) delete put;
  else c.ops.insert(put);
  // Remote completion: the data is in the target's memory when the flush ends.
  auto* flush = new Op(Op::kFlush);
  flush->provider = this;
  flush->conn = &c;
  flush->req = p.req;
  flush->bytes = p.len;
  param.user_data = flush;
  r = ucp_ep_flush_nbx(c.ep, &param);
  if (UCS_PTR_IS_PTR(r)) {
    c.ops.insert(flush);
    return;
  }
  delete flush;
  if (UCS_PTR_IS_ERR(r)) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_PEER_LOST,
                 std::string("ucp_ep_flush_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
  } else {
    put_finished(c, p.req, p.len, HMC_PROV_OK, {});
  }
}

void Provider::put_finished(Conn& c, Request* req, size_t bytes, int rc, const std::string& why) {
  if (rc == HMC_PROV_OK) req->complete(bytes);
  else req->fail(rc, why);
  if (c.puts > 0) --c.puts;
  pending_.insert(c.id);  // sends held behind it may go now
  wake_later();
}

void Provider::drop_keys(Conn& c) {
  for (auto& [key, k] : c.keys)
    if (k.rkey != nullptr) dead_rkeys_.push_back(k.rkey);
  c.keys.clear();
}

}  // namespace hmc_ucx
