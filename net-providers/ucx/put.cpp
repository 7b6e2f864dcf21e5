// Puts, gets and their checks.
//
// The packed key is a KeyHead (region id, a random nonce, base address and
// length) followed by UCP's packed rkey (memory.cpp makes it). Puts are checked on the target's
// authority: before the first put with a key, the initiator sends the whole
// key and the range in a kCheck message; the target compares the key byte
// for byte with the one it handed out for that region and checks the range,
// and answers kReply. A refused put fails with HMC_PROV_ERR_OUT_OF_BOUNDS and
// no byte is written. An accepted key is kept (unpacked) per connection, so
// later puts with it are one round trip shorter, checked against the
// verified length; dereg_mem sends kRevoke on every connection that holds it,
// in sequence ahead of anything sent after, so a stale key is checked again.
// A peer that copies its puts through a mapping (below) writes without this side
// seeing it, so it says so first (kMapped, answered kMappedAck; its puts go as active
// messages until then), and dereg_mem waits for its kRevoked: the peer sends it under
// its lock, which every copy holds, so no copy into the region is under way after.
//
// A get goes through the same check (the target vouches for the region it is read
// from), then ucp_get_nbx (start_get). Where the region is mapped here (shared memory from
// the target's mem_alloc) a put or get is a memcpy through the mapping, as UCP's would be.
//
// A put is ucp_put_nbx then ucp_ep_flush_nbx; the request completes when the
// flush does, i.e. when the data is in the target's memory. Until then later
// sends on the connection wait (Conn::held): the ordering contract.
//
// Over tcp, UCX's put is slow (its own ucp_put_bw: 0.6 GB/s at 4 MiB on
// loopback, where its active messages move 6.6 GB/s; docs/ucx.md), so there a
// put may go as an active message instead (kPutData, HMC_UCX_PUT): the
// target checks the region, the offset and that the key was verified on this
// connection, takes the data straight into the region (UCP's rendezvous for
// large ones), then answers kPutDone. The put completes when UCP has sent it
// and the answer is in. A region being deregistered first waits (bounded) for
// the puts landing in it. `auto` picks this wherever UCX would otherwise have
// the target write on the initiator's behalf (am_put_for).
#include <cstring>

#include "provider.h"

namespace hmc_ucx {

int Provider::put(void* conn, const void* src, size_t len, const void* rkey, size_t rkey_len,
                  uint64_t offset, void** req) {
  if (req == nullptr || (src == nullptr && len > 0)) return HMC_PROV_ERR_INVALID;
  return one_sided(conn, PendingPut{0, nullptr, static_cast<const char*>(src), len, offset, {}}, rkey, rkey_len, req);
}

int Provider::get(void* conn, void* dst, size_t len, const void* rkey, size_t rkey_len, uint64_t offset,
                  void** req) {
  if (req == nullptr || (dst == nullptr && len > 0)) return HMC_PROV_ERR_INVALID;
  PendingPut p{0, nullptr, nullptr, len, offset, {}};
  p.dst = static_cast<char*>(dst);
  return one_sided(conn, std::move(p), rkey, rkey_len, req);
}

// A put or a get: checked against the key, then started, or first sent to the target for
// its verdict on a key this connection has not used yet.
int Provider::one_sided(void* conn, PendingPut p, const void* rkey, size_t rkey_len, void** req) {
  const size_t len = p.len;
  const uint64_t offset = p.offset;
  KeyHead head;
  if (!parse_key(rkey, rkey_len, head)) return HMC_PROV_ERR_INVALID;
  // Early refusal from the key; the target decides for keys it has not verified.
  if (offset > head.length || len > head.length - offset) return HMC_PROV_ERR_OUT_OF_BOUNDS;
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return HMC_PROV_ERR_CLOSED;
  if (c->state == Conn::kFailed) return c->error;
  if (c->state != Conn::kOpen) return HMC_PROV_ERR_INVALID;
  const std::string_view key(static_cast<const char*>(rkey), rkey_len);
  const auto k = c->keys.find(key);
  // A get needs memory UCP reads directly (start_get); for a key known not to be, the
  // host hears at once and puts instead.
  if (p.dst != nullptr && k != c->keys.end() && k->second.am) return HMC_PROV_ERR_INVALID;
  p.id = next_put_++;
  p.req = requests_.create();
  *req = p.req;
  ++c->puts;  // gets count too: later sends wait for them, and dead rkeys outlive them
  if (k != c->keys.end()) {
    // Into mapped memory the put is a memcpy under mu_ (70 us at 4 MiB over shm here):
    // the host is busy in here, not gone. The thread leaves mu_ alone meanwhile, and the
    // end counts as a poll; else it took the host for one that stopped and waited on mu_
    // for every put (a futex wake per 4 MiB put, 58 -> 66 GB/s without).
    host_inside_.fetch_add(1, std::memory_order_relaxed);
    start_put(*c, std::move(p), k->second);  // the usual case: no copy of the key
    host_inside_.fetch_sub(1, std::memory_order_relaxed);
    note_host_call();
  } else {
    const uint64_t id = p.id;
    p.key.assign(key);
    c->checking.emplace(id, std::move(p));
    send_control(*c, Kind::kCheck, id, offset, len, std::string(key));
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
  if (put_mode_ == PutMode::kAuto) k.mapped = mapped_for(k);
  k.am = am_put_for(k);
  host_.log(HMC_LOG_DEBUG, "puts to " + c.peer + " into region " + std::to_string(k.region) + " go " +
                               (k.am ? "as active messages" : k.mapped ? "by memcpy into its mapping" : "by ucp_put_nbx"));
  auto& slot = c.keys[p.key];
  slot = k;
  // Puts copy through the mapping once the target knows it must wait for them.
  if (k.mapped != nullptr) send_control(c, Kind::kMapped, k.region, k.nonce, 0, {});
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
  // Under mu_, as every copy through the mapping is: none of ours is under way now.
  if (w.len == 1) send_control(c, Kind::kRevoked, w.token, w.arg, 0, {});
}

// Target: the peer will copy its puts into this region through a mapping, which this side
// cannot see; from the answer on, dereg_mem waits for the peer's kRevoked.
void Provider::on_mapped(Conn& c, const Wire& w) {
  auto it = regions_.find(w.token);
  if (it == regions_.end() || it->second->nonce != w.arg || !it->second->verified.contains(c.id)) return;
  it->second->mapped_by.insert(c.id);
  send_control(c, Kind::kMappedAck, w.token, w.arg, 0, {});
}

void Provider::on_mapped_ack(Conn& c, const Wire& w) {
  for (auto& [key, k] : c.keys)
    if (k.region == w.token && k.nonce == w.arg) k.map_known = true;
}

void Provider::start_put(Conn& c, PendingPut p, const VerifiedKey& k) {
  if (p.len == 0) {
    put_finished(c, p.req, 0, HMC_PROV_OK, {});
    return;
  }
  if (p.dst != nullptr) {
    start_get(c, std::move(p), k);
    return;
  }
  if (k.am || (k.mapped != nullptr && !k.map_known)) {
    start_am_put(c, std::move(p), k);
    return;
  }
  if (k.mapped != nullptr) {  // in the target's memory when the copy ends: no request, no flush
    std::memcpy(k.mapped + p.offset, p.src, p.len);
    copied(c, p);
    return;
  }
  // No callback of its own: the flush behind it reports the put's outcome, and a request
  // UCP still holds is freed now and released by UCP when it completes.
  const ucp_request_param_t bare{};
  void* r = ucp_put_nbx(c.ep, p.src, p.len, k.base + p.offset, k.rkey, &bare);
  if (UCS_PTR_IS_ERR(r)) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_PEER_LOST,
                 std::string("ucp_put_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    broken(c, UCS_PTR_STATUS(r));
    return;
  }
  if (r != nullptr) ucp_request_free(r);
  // Remote completion: the data is in the target's memory when the flush ends.
  auto* flush = new Op(Op::kFlush);
  flush->provider = this;
  flush->conn = &c;
  flush->req = p.req;
  flush->bytes = p.len;
  const ucp_request_param_t param = send_param(flush);
  r = ucp_ep_flush_nbx(c.ep, &param);
  if (UCS_PTR_IS_PTR(r)) {
    c.ops.insert(flush);
    return;
  }
  delete flush;
  if (UCS_PTR_IS_ERR(r)) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_PEER_LOST,
                 std::string("ucp_ep_flush_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    broken(c, UCS_PTR_STATUS(r));
  } else {
    put_finished(c, p.req, p.len, HMC_PROV_OK, {});
  }
}

// A get is ucp_get_nbx, done when the bytes are in the caller's buffer: no flush. Only
// where puts go by ucp_put_nbx too (am_put_for false: shared memory the initiator maps, or
// verbs); elsewhere UCX would emulate it through the target, so the host is told to put.
void Provider::start_get(Conn& c, PendingPut p, const VerifiedKey& k) {
  if (k.am) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_INVALID,
                 "get refused: " + c.peer + "'s region is not readable directly here (HMC_UCX_PUT, docs/ucx.md)");
    return;
  }
  if (k.mapped != nullptr) {
    std::memcpy(p.dst, k.mapped + p.offset, p.len);
    copied(c, p);
    return;
  }
  auto* get = new Op(Op::kGet);
  get->provider = this;
  get->conn = &c;
  get->req = p.req;
  get->bytes = p.len;
  const ucp_request_param_t param = send_param(get);
  void* r = ucp_get_nbx(c.ep, p.dst, p.len, k.base + p.offset, k.rkey, &param);
  if (UCS_PTR_IS_PTR(r)) {
    c.ops.insert(get);
    return;
  }
  delete get;
  if (UCS_PTR_IS_ERR(r)) {
    put_finished(c, p.req, 0, HMC_PROV_ERR_PEER_LOST,
                 std::string("ucp_get_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    broken(c, UCS_PTR_STATUS(r));
    return;
  }
  put_finished(c, p.req, p.len, HMC_PROV_OK, {});
}

// auto: ucp_put_nbx only where nothing on the target writes on the initiator's behalf:
// verbs (the NIC refuses a revoked key) and shared-memory segments the initiator maps
// (ucp_rkey_ptr). UCX's tcp put and its emulated shared-memory put write wherever they are
// told, even into a region deregistered a moment before; active messages are checked by
// the target, and as fast or faster (docs/ucx.md). With tcp and no verbs every endpoint is
// tcp (provider.cpp: PEER mode leaves posix and sysv out), even where UCP could map.
// `k.mapped` is mapped_for's answer already (on_reply).
bool Provider::am_put_for(const VerifiedKey& k) const {
  if (put_mode_ != PutMode::kAuto) return put_mode_ == PutMode::kAm;
  return !rdma_ && k.mapped == nullptr;
}

// Where the target's region is mapped in this process (shared memory from the target's
// mem_alloc), or null: verbs and tcp map nothing.
char* Provider::mapped_for(const VerifiedKey& k) const {
  void* mapped = nullptr;
  if (rdma_ || tcp_only_ || k.rkey == nullptr || ucp_rkey_ptr(k.rkey, k.base, &mapped) != UCS_OK) return nullptr;
  return static_cast<char*>(mapped);
}

void Provider::start_am_put(Conn& c, PendingPut p, const VerifiedKey& k) {
  AmPut& entry = c.am_puts[p.id];
  entry.req = p.req;
  entry.len = p.len;
  auto* op = new Op(Op::kPutSend);
  op->provider = this;
  op->conn = &c;
  op->put = p.id;
  op->bytes = p.len;
  op->wire = Wire{c.peer_id, static_cast<uint32_t>(Kind::kPutData), c.peer_cookie, c.send_seq++, p.id, p.offset, k.region};
  const ucp_request_param_t param = send_param(op);
  void* r = ucp_am_send_nbx(c.ep, kAmId, &op->wire, sizeof(Wire), p.src, p.len, &param);
  if (UCS_PTR_IS_PTR(r)) {
    c.ops.insert(op);
    return;
  }
  delete op;
  if (UCS_PTR_IS_ERR(r)) {
    am_put_step(c, p.id, true, HMC_PROV_ERR_PEER_LOST,
                std::string("ucp_am_send_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    broken(c, UCS_PTR_STATUS(r));
  } else
    am_put_step(c, p.id, true, HMC_PROV_OK, {});
}

// Initiator: one of an active-message put's two ends (UCP sent it, or the
// target answered) is in; the first failure decides, both successes finish it.
void Provider::am_put_step(Conn& c, uint64_t id, bool sent, int rc, const std::string& why) {
  auto it = c.am_puts.find(id);
  if (it == c.am_puts.end()) return;  // failed already (with its connection)
  AmPut& p = it->second;
  (sent ? p.sent : p.answered) = true;
  if (rc == HMC_PROV_OK && !(p.sent && p.answered)) return;
  AmPut done = std::move(p);
  c.am_puts.erase(it);
  put_finished(c, done.req, rc == HMC_PROV_OK ? done.len : 0, rc, why);
}

// Target: a put's data, in its turn. Written only into a live region whose key
// this connection had verified, inside its bounds.
void Provider::on_put_data(Conn& c, Incoming& m) {
  const uint64_t id = m.wire.token, offset = m.wire.arg;
  auto it = regions_.find(m.wire.len);
  std::string why;
  if (it == regions_.end()) {
    why = "the region was deregistered (stale remote key)";
  } else if (!it->second->verified.contains(c.id)) {
    why = "remote key not checked on this connection";
  } else if (offset > it->second->len || m.len > it->second->len - offset) {
    why = "put of " + std::to_string(m.len) + " bytes at offset " + std::to_string(offset) + " leaves the " +
          std::to_string(it->second->len) + "-byte region";
  }
  if (!why.empty()) {
    drop(m);
    send_control(c, Kind::kPutDone, id, kRefused, 0, why);
    return;
  }
  char* dest = it->second->base + offset;
  if (!m.rndv) {
    if (m.len > 0) std::memcpy(dest, m.bytes(), m.len);
    drop(m);
    send_control(c, Kind::kPutDone, id, kLanded, 0, {});
    return;
  }
  auto* op = new Op(Op::kPutRecv);
  op->provider = this;
  op->conn = &c;
  op->put = id;
  op->region = m.wire.len;
  op->bytes = m.len;
  void* q = fetch(m, op, dest);
  if (UCS_PTR_IS_PTR(q)) {
    c.ops.insert(op);
    return;
  }
  delete op;
  if (UCS_PTR_IS_ERR(q))
    send_control(c, Kind::kPutDone, id, kLost, 0, std::string("receive failed: ") + ucs_status_string(UCS_PTR_STATUS(q)));
  else
    send_control(c, Kind::kPutDone, id, kLanded, 0, {});
}

// Initiator: the target's answer to an active-message put.
void Provider::on_put_done(Conn& c, const Wire& w, const std::string& why) {
  if (w.arg == kLanded) am_put_step(c, w.token, false, HMC_PROV_OK, {});
  else if (w.arg == kRefused) am_put_step(c, w.token, false, HMC_PROV_ERR_OUT_OF_BOUNDS, "put refused by the peer: " + why);
  else am_put_step(c, w.token, false, HMC_PROV_ERR_PEER_LOST, "put failed at the peer: " + why);
}

// Is a put still landing in `region` from a peer that can still deliver? That is a
// connection that carries, or one that close_conn closes (it lets mu_ go while it waits
// for what UCX still fetches) to a live peer, or an operation such a close gave up on.
// A peer that failed or is gone delivers nothing more (UCX never hands its rendezvous back).
bool Provider::landing(uint64_t region) const {
  for (const auto& [id, c] : conns_) {
    if (!c->carries() && !(c->closing && !c->peer_gone)) continue;
    for (const Op* op : c->ops)
      if (op->type == Op::kPutRecv && op->region == region) return true;
  }
  for (const Op* op : orphans_)
    if (op->type == Op::kPutRecv && op->region == region) return true;
  return false;
}

// A put or get copied through the mapping. The release fence orders the copy (a put's
// stores, a get's reads of the peer's buffer) before the stores of anything sent after it
// (a NOTIFY, a GET_DONE that frees that buffer) where the CPU would not: x86 does, and
// memcpy's non-temporal stores end with an sfence of their own. A full fence cost 4 % of a
// 64 KiB put stream here, waiting for the copy's stores to drain.
void Provider::copied(Conn& c, const PendingPut& p) {
  std::atomic_thread_fence(std::memory_order_release);
  put_finished(c, p.req, p.len, HMC_PROV_OK, {});
}

void Provider::put_finished(Conn& c, Request* req, size_t bytes, int rc, const std::string& why) {
  if (rc == HMC_PROV_OK) req->complete(bytes);
  else req->fail(rc, why);
  if (c.puts > 0) --c.puts;
  mark_pending(c);  // sends held behind it may go now
  wake_later();
}

void Provider::drop_keys(Conn& c) {
  for (auto& [key, k] : c.keys)
    if (k.rkey != nullptr) dead_rkeys_.push_back(k.rkey);
  c.keys.clear();
}

}  // namespace hmc_ucx
