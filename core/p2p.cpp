// CommImpl point-to-point engine: tag matching, eager and rendezvous, progress.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::core {
namespace {

// Passes over a lost peer's connection before the loss is marked (progress()).
constexpr int kDrainPasses = 64;
// How long a peer the control plane lost may keep its connection up before the loss
// fails what is pending: long enough for a provider's thread to read what the peer sent.
constexpr auto kLeaveGrace = std::chrono::milliseconds(500);

// A refusal's reason as it travels: cut to what the peer's receive slots hold.
std::string reason_text(const Status& why) { return why.message().substr(0, kReasonMax); }

std::string mismatch_text(std::size_t posted, uint64_t got, int peer, uint64_t tag) {
  return "receive of " + std::to_string(posted) + " bytes from rank " + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ") matched a message of " + std::to_string(got) + " bytes";
}

}  // namespace

std::function<void(const Status&)> parts_of(std::shared_ptr<Operation> op, std::shared_ptr<int> parts, std::size_t bytes) {
  return [op = std::move(op), parts = std::move(parts), bytes](const Status& st) {
    if (!st.ok()) op->fail(st);
    if (--*parts == 0) op->complete(bytes);  // a no-op after a failure
  };
}

Status from_provider(int rc, const char* msg, const std::string& who) {
  ErrorCode code = ErrorCode::kInternal;
  switch (rc) {
    case HMC_PROV_ERR_PEER_LOST: code = ErrorCode::kPeerLost; break;
    case HMC_PROV_ERR_CLOSED: code = ErrorCode::kAborted; break;
    case HMC_PROV_ERR_OUT_OF_BOUNDS: code = ErrorCode::kOutOfBounds; break;
    case HMC_PROV_ERR_TRUNCATED: code = ErrorCode::kMismatch; break;
    case HMC_PROV_ERR_INVALID: code = ErrorCode::kInvalidArgument; break;
    case HMC_PROV_ERR_NO_MEMORY: code = ErrorCode::kNoMemory; break;
    case HMC_PROV_ERR_REFUSED: code = ErrorCode::kRefused; break;
    default: break;
  }
  std::string text = msg && *msg                     ? std::string(msg)
                     : rc == HMC_PROV_ERR_PEER_LOST ? "the connection is gone (the peer closed it or exited)"
                                                    : "provider error " + provider_error_name(rc);
  if (code == ErrorCode::kPeerLost && text.rfind("peer lost", 0) == 0) text = text.substr(std::min<std::size_t>(text.size(), 11));
  return {code, who + ": " + text};
}

CommImpl::OnEnd CommImpl::OnEnd::with(std::shared_ptr<Operation> op, std::size_t bytes, bool completes) {
  OnEnd e;
  e.op = std::move(op);
  e.bytes = bytes;
  e.completes = completes;
  return e;
}

void CommImpl::OnEnd::operator()(const Status& s) const {
  if (done) return done(s);
  if (!op) return;
  if (!s.ok()) op->fail(s);
  else if (completes) op->complete(bytes);
}

Status CommImpl::track(Peer& p, int rc, void* req, OnEnd end, const char* what, std::shared_ptr<MsgBuf> msg) {
  if (rc != 0 || !req) {
    Status s = from_provider(rc, nullptr, std::string(what) + " to " + describe(p));
    end(s);
    // Refused at once (a CTS or credit answering a message just taken): messages that
    // arrived before the end may still wait in the slots and the provider (Peer::ending).
    if (rc == HMC_PROV_ERR_PEER_LOST) lose(p, s);
    return s;
  }
  p.inflight.push_back({req, std::move(end), std::move(msg)});
  return {};
}

std::shared_ptr<CommImpl::MsgBuf> CommImpl::take_msg_buf(std::size_t len) {
  constexpr std::size_t kMsgBufsKept = 32;
  for (auto& b : msg_bufs_)
    if (b.use_count() == 1 && b->cap >= len) return b;
  auto fresh = std::make_shared<MsgBuf>();
  fresh->cap = std::max(len, sizeof(WireHeader) + eager_limit_);
  fresh->bytes.reset(new uint8_t[fresh->cap]);  // not zeroed: every message writes what it sends
  if (msg_bufs_.size() < kMsgBufsKept) msg_bufs_.push_back(fresh);
  return fresh;
}

void CommImpl::post_msg(Peer& p, MsgType type, uint64_t tag, uint64_t id, uint64_t size, uint64_t aux,
                        const void* payload, std::size_t payload_len, OnEnd end) {
  if (!p.conn) {  // closed: lost, or the communicator's end
    end(p.lost.ok() ? Status(ErrorCode::kAborted, "connection closed") : p.lost);
    return;
  }
  const std::size_t len = sizeof(WireHeader) + payload_len;
  auto msg = take_msg_buf(len);
  WireHeader h{kWireMagic, static_cast<uint32_t>(type), tag, id, size, aux};
  std::memcpy(msg->bytes.get(), &h, sizeof(h));
  if (payload_len) std::memcpy(msg->bytes.get() + sizeof(h), payload, payload_len);
  void* req = nullptr;
  int rc = p.net->net->send_msg(p.net->state, p.conn, msg->bytes.get(), len, &req);
  // A send refused at once reaches `end` like one that fails later.
  (void)track(p, rc, req, std::move(end), "send", std::move(msg));
}

void CommImpl::post_ctrl_recv(Peer& p, CtrlSlot& slot) {
  slot.req = nullptr;
  int rc = p.net->net->recv_msg(p.net->state, p.conn, slot.buf.data(), slot.buf.size(), &slot.req);
  if (rc != 0) {
    slot.req = nullptr;
    lose(p, from_provider(rc, nullptr, "receive from " + describe(p)));
  }
}

std::shared_ptr<Operation> CommImpl::isend(const void* buf, std::size_t bytes, int peer, uint64_t tag) {
  std::lock_guard lock(mu_);
  if (Status s = usable(); !s.ok()) return Operation::failed(s);
  Peer& p = peers_[peer];
  if (!p.lost.ok()) return Operation::failed(p.lost);
  auto op = Operation::make(ctx_.engine());
  op->what = {"send", peer, tag, bytes};
  const auto* data = static_cast<const uint8_t*>(buf);
  const bool device = bytes && ctx_.device_mem(buf, bytes);
  if (p.net) {
    if (must_hold(p, bytes, device)) {
      p.held.push_back({op, data, bytes, tag, device, deadline_after(p.path.credit_wait)});
      events_.rescan();  // the clock may release it too, not only a credit message
    } else {
      start_send(p, op, data, bytes, tag, device);
    }
    return op;
  }
  // Self: delivered like an eager message that never leaves the process.
  std::vector<uint8_t> host;
  if (Status s = device ? via_host(data, bytes, host) : Status{}; !s.ok()) return Operation::failed(s);
  for (auto it = p.posted.begin(); it != p.posted.end(); ++it) {
    if (it->tag != tag) continue;
    RecvOp r = std::move(*it);
    p.posted.erase(it);
    deliver_eager(p, r, data, bytes);
    if (!r.op->status().ok()) op->fail(r.op->status());  // a mismatch, or a failed copy in
    else op->complete(bytes);
    return op;
  }
  p.unexpected.push_back({MsgType::kEager, tag, bytes, 0, 0, std::vector<uint8_t>(data, data + bytes)});
  op->complete(bytes);
  return op;
}

Status CommImpl::via_host(const uint8_t*& data, std::size_t bytes, std::vector<uint8_t>& host) {
  host.resize(bytes);
  HMC_RETURN_IF_ERROR(ctx_.copy(host.data(), data, bytes));
  data = host.data();
  return {};
}

// Device bytes to a peer on this host go by rendezvous at any size: the receiver can take
// them by IPC (one device copy), where an eager message stages them through the host on
// both sides (docs/performance.md, "shm's eager limit").
bool CommImpl::eager_sized(const Peer& p, std::size_t bytes, bool device) const {
  return bytes <= p.path.eager_limit && !(device && p.ipc_ok);
}

void CommImpl::start_send(Peer& p, const std::shared_ptr<Operation>& op, const uint8_t* data, std::size_t bytes,
                          uint64_t tag, bool device) {
  if (eager_sized(p, bytes, device) && eager_fits(p, bytes)) {
    std::vector<uint8_t> host;
    if (Status s = device ? via_host(data, bytes, host) : Status{}; !s.ok()) return op->fail(s);
    spend_eager_credit(p, bytes);
    post_msg(p, MsgType::kEager, tag, 0, bytes, 0, data, bytes, OnEnd::completes_with(op, bytes));
    return;
  }
  uint64_t id = next_id_++;
  SendOp& send = p.rndv_sends[id] = {op, data, bytes, device};
  std::vector<uint8_t> key;  // the sender's buffer's, for a receiver that gets
  // Whether this core is free to copy this message or half of it (no rendezvous receive of
  // its own under way): asked only at the sizes that split or take turns.
  const bool free = !device && bytes >= std::min(p.path.split_from, p.path.turns_from) && !busy_with(&Peer::rndv_recvs);
  const bool split = free && bytes >= p.path.split_from;
  const bool by_get = bytes <= p.path.get_limit || bytes >= p.path.get_from || split;
  const uint64_t turn = free && bytes >= p.path.turns_from ? kRtsTurn | (p.rndv_sends.size() > 1 ? kRtsMore : 0) : 0;
  const uint64_t offered = (split ? kRtsSplit : 0) | turn;
  const uint64_t flags = device ? kRtsFromDevice : by_get && offer_get(p, send, key) ? kRtsGet | offered : 0;
  post_msg(p, MsgType::kRts, tag, id, bytes, flags, key.data(), key.size(), OnEnd::fails(op));
}

std::shared_ptr<Operation> CommImpl::irecv(void* buf, std::size_t bytes, int peer, uint64_t tag) {
  std::lock_guard lock(mu_);
  if (Status s = usable(); !s.ok()) return Operation::failed(s);
  Peer& p = peers_[peer];
  auto op = Operation::make(ctx_.engine());
  op->what = {"receive", peer, tag, bytes};
  RecvOp r{op, static_cast<uint8_t*>(buf), bytes, tag, next_id_++};
  r.device = bytes && ctx_.device_mem(buf, bytes);
  for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
    if (it->tag != tag) continue;
    Unexpected u = std::move(*it);
    p.unexpected.erase(it);
    if (u.type == MsgType::kEager) deliver_eager(p, r, u.data.data(), u.size);
    else if (!p.lost.ok()) op->fail(p.lost);  // the RTS came, its data never will
    else start_rndv_recv(p, std::move(r), u.sender_id, u.size, u.aux, u.data.data(), u.data.size());
    return op;
  }
  if (!p.lost.ok()) return Operation::failed(p.lost);  // nothing buffered and nothing more will come
  p.posted.push_back(std::move(r));
  return op;
}

bool CommImpl::withdraw_recv(int peer, const std::shared_ptr<Operation>& op, const Status& why) {
  std::lock_guard lock(mu_);
  auto& posted = peers_[peer].posted;
  auto it = std::find_if(posted.begin(), posted.end(), [&](const RecvOp& r) { return r.op == op; });
  if (it == posted.end()) return false;
  posted.erase(it);  // not matched: nothing registered or staged for it yet
  op->fail(why);
  return true;
}

void CommImpl::deliver_eager(Peer& p, RecvOp& r, const uint8_t* data, std::size_t size) {
  consumed_eager(p, size);
  if (size != r.bytes) {
    r.op->fail({ErrorCode::kMismatch, mismatch_text(r.bytes, size, p.rank, r.tag)});
    return;
  }
  if (Status s = copy_in(r.buf, data, size, r.device); !s.ok()) return r.op->fail(s);
  r.op->complete(size);
}

void CommImpl::refuse_unreceived(Peer& p, uint64_t sender_id, uint64_t size) {
  const std::string text = "rank " + std::to_string(rank_) + " reached finalize() without a receive for it";
  post_msg(p, MsgType::kNak, 0, sender_id, size, static_cast<uint64_t>(ErrorCode::kFinalized), text.data(),
           text.size(), nullptr);
}

Status CommImpl::copy_in(void* dst, const void* src, std::size_t bytes, bool device) {
  if (device) return ctx_.copy(dst, src, bytes);
  if (bytes) std::memcpy(dst, src, bytes);
  return {};
}

void CommImpl::start_rndv_recv(Peer& p, RecvOp r, uint64_t sender_id, uint64_t size, uint64_t rts_flags,
                               const uint8_t* key, std::size_t key_len) {
  auto refuse = [&](Status why) {
    if (r.staged) dev_.release(r.staged);
    r.staged = nullptr;
    std::string text = reason_text(why);
    post_msg(p, MsgType::kNak, 0, sender_id, size, static_cast<uint64_t>(why.code()), text.data(), text.size(), nullptr);
    r.op->fail(std::move(why));
  };
  if (size != r.bytes) return refuse({ErrorCode::kMismatch, mismatch_text(r.bytes, size, p.rank, r.tag)});
  if ((rts_flags & kRtsSplit) && start_split(p, r, sender_id, key, key_len)) return;
  // A size the sender offered only for a split goes by put where this side cannot split.
  const bool get_band = size <= p.path.get_limit || size >= p.path.get_from;
  if ((rts_flags & kRtsGet) && get_band && !senders_turn(p, r, rts_flags) && start_get(p, r, sender_id, key, key_len)) return;
  if (auto offer = ipc_offer(p, r, rts_flags)) {
    r.ipc_key = offer_key(*offer);
    std::vector<uint8_t> wire = encode_offer(*offer);
    uint64_t id = r.id;
    auto op = r.op;
    p.rndv_recvs[id] = std::move(r);
    post_msg(p, MsgType::kCtsIpc, 0, sender_id, size, id, wire.data(), wire.size(), OnEnd::fails(op));
    return;
  }
  r.ipc_key = 0;
  if (r.device) {  // the data lands in pinned host memory, then moves to the device on FIN
    auto staged = dev_.stage(ctx_.mem_info(r.buf, size), size);
    if (!staged) return refuse(staged.status());
    r.staged = staged.value();
  }
  std::vector<uint8_t> rkey;
  if (Status s = register_buffer(p, r.staged ? r.staged : r.buf, size, r.reg, rkey); !s.ok()) return refuse(std::move(s));
  std::size_t len = rkey.size();
  uint64_t id = r.id;
  auto op = r.op;
  const bool staged = r.staged != nullptr;
  p.rndv_recvs[id] = std::move(r);
  post_msg(p, MsgType::kCts, staged ? kCtsStaged : 0, sender_id, size, id, rkey.data(), len, OnEnd::fails(op));
}

// Buffers inside HMC allocations keep their registration between messages: a provider
// may do real work per registration (shm maps shared memory on the peer). Any free in the
// context flushes the idle entries, so a cached key never outlives its memory.
Status CommImpl::register_buffer(Peer& p, uint8_t* target, std::size_t size, Reg& reg, std::vector<uint8_t>& rkey,
                                 bool cached_only) {
  const bool cacheable = ctx_.owns(target, size);
  if (cached_only && !cacheable) return {ErrorCode::kUnsupported, "not inside an HMC allocation"};
  if (std::all_of(reg_cache_.begin(), reg_cache_.end(), [](const RegCacheEntry& e) { return e.stale && !e.in_use; }))
    reg_cache_.clear();
  if (cacheable) {
    if (uint64_t gen = ctx_.free_generation(); gen != reg_cache_gen_) {
      flush_reg_cache(false);
      reg_cache_gen_ = gen;
    }
    for (auto& e : reg_cache_) {
      if (e.net == p.net && e.ptr == target && e.len == size && !e.stale) {
        ++e.in_use;
        reg.cached = &e - reg_cache_.data() + 1;
        rkey = e.rkey;
        return {};
      }
    }
  }
  void* mr = nullptr;
  if (int rc = p.net->net->reg_mem(p.net->state, target, size, HMC_MEM_HOST, &mr); rc != 0)
    return from_provider(rc, nullptr, "registering the receive buffer with " + p.net->name);
  rkey.resize(HMC_NET_RKEY_MAX);
  std::size_t len = 0;
  if (int rc = p.net->net->pack_rkey(p.net->state, mr, rkey.data(), rkey.size(), &len); rc != 0) {
    p.net->net->dereg_mem(p.net->state, mr);
    return from_provider(rc, nullptr, "packing a remote key with " + p.net->name);
  }
  rkey.resize(len);
  if (cacheable && reg_cache_.size() < kRegCacheMax) {
    reg_cache_.push_back({p.net, target, size, mr, rkey, 1, false});
    reg.cached = reg_cache_.size();
  } else {
    reg.mr = mr;
  }
  return {};
}

void CommImpl::release_reg(Peer& p, Reg& reg) {
  if (reg.mr) p.net->net->dereg_mem(p.net->state, reg.mr);
  reg.mr = nullptr;
  if (reg.cached) {
    RegCacheEntry& e = reg_cache_[reg.cached - 1];
    --e.in_use;
    reg.cached = 0;
    if (e.stale && e.in_use == 0 && e.mr) {
      e.net->net->dereg_mem(e.net->state, e.mr);
      e.mr = nullptr;
    }
  }
}

void CommImpl::release_recv(Peer& p, RecvOp& r) {
  release_reg(p, r.reg);
  if (r.staged && r.copies > 0) draining_[r.staged] += r.copies;  // chunk copies still read it
  else if (r.staged) dev_.release(r.staged);
  r.staged = nullptr;
}

void CommImpl::flush_reg_cache(bool all) {
  // Entries in use stay (as stale) until their receive ends: indexes must stay valid. With
  // `all` (connections closed) even those give up their registration.
  bool any_in_use = false;
  for (auto& e : reg_cache_) {
    any_in_use |= e.in_use > 0;
    if (e.in_use && !all) {
      e.stale = true;
      continue;
    }
    if (e.mr) e.net->net->dereg_mem(e.net->state, e.mr);
    e.mr = nullptr;
    e.stale = true;
  }
  if (!any_in_use) reg_cache_.clear();
}

void CommImpl::on_cts(Peer& p, const WireHeader& h, const uint8_t* rkey, std::size_t rkey_len) {
  if (h.tag & kCtsSplit) return on_split_cts(p, h, rkey, rkey_len);
  std::optional<SendOp> taken = take_send(p, h.id);
  if (!taken) return;
  const SendOp& s = *taken;
  if (s.device || (h.tag & kCtsStaged)) return send_staged(p, s, h.aux, std::vector<uint8_t>(rkey, rkey + rkey_len));
  // Two parts: the put and the FIN behind it; the send is done when both are. A split send
  // whose receiver could not get its half asks for the rest (kCtsRest): these two parts
  // take the place of the kGetDone that will not come, besides the head's put and FIN.
  const std::size_t from = (h.tag & kCtsRest) && s.split_parts && h.size < s.bytes ? h.size : 0;
  if (s.split_parts) ++*s.split_parts;
  auto part_done = s.split_parts ? s.split_done : parts_of(s.op, std::make_shared<int>(2), s.bytes);
  void* req = nullptr;
  int rc = p.net->net->put(p.net->state, p.conn, s.buf + from, s.bytes - from, nullptr, rkey, rkey_len, from, &req);
  // A put refused at once moved nothing: a FIN would end the receive on stale bytes.
  if (Status refused = track(p, rc, req, part_done, "put"); !refused.ok()) return fail_receiver(p, h.aux, refused);
  post_msg(p, MsgType::kFin, 0, h.aux, s.bytes - from, 0, nullptr, 0, part_done);
}

void CommImpl::fail_receiver(Peer& p, uint64_t receiver_id, const Status& why) {
  if (!p.lost.ok() || state_.load() != 0) return;  // nobody left to tell, or closing anyway
  std::string text = reason_text(why);
  post_msg(p, MsgType::kCtsRefused, 0, receiver_id, 0, static_cast<uint64_t>(why.code()), text.data(), text.size(), nullptr);
}

void CommImpl::send_staged(Peer& p, const SendOp& s, uint64_t receiver_id, std::vector<uint8_t> rkey) {
  const ContextImpl::MemInfo from = ctx_.mem_info(s.buf, s.bytes);
  // Device bytes go through pinned host memory; host bytes are put from where they are.
  uint8_t* staging = nullptr;
  if (s.device) {
    auto staged = dev_.stage(from, s.bytes);
    if (!staged) {
      fail_receiver(p, receiver_id, staged.status());
      return s.op->fail(staged.status());
    }
    staging = staged.value();
  }
  const uint8_t* src = staging ? staging : s.buf;
  const std::size_t chunk = std::min(stage_chunk_, s.bytes);
  const std::size_t n = (s.bytes + chunk - 1) / chunk;
  // Parts: each chunk's put, and the FIN behind the last. The staging buffer is free again
  // once all of them ended, whichever way.
  auto parts = std::make_shared<std::size_t>(n + 1);
  auto part_done = [this, op = s.op, parts, bytes = s.bytes, staging](const Status& st) {
    if (!st.ok()) op->fail(st);
    if (--*parts > 0) return;
    if (staging) dev_.release(staging);
    op->complete(bytes);  // a no-op after a failure
  };
  auto key = std::make_shared<std::vector<uint8_t>>(std::move(rkey));
  auto failed = std::make_shared<bool>(false);
  // Chunks not yet handed on: the FIN goes behind whichever is handed on last, not behind
  // the highest, as the receive ends on the FIN and ignores chunks that come after it.
  auto left = std::make_shared<std::size_t>(n);
  // Runs when chunk k is ready to go (or could not get there): put it, say so.
  auto landed = [this, &p, part_done, key, failed, left, src, chunk, n, receiver_id,
                 bytes = s.bytes](std::size_t k, Status st) {
    const std::size_t off = k * chunk, len = std::min(chunk, bytes - off);
    const bool last = --*left == 0;
    if (st.ok() && !p.lost.ok()) st = p.lost;
    if (st.ok() && *failed) st = {ErrorCode::kAborted, "an earlier chunk of this send failed"};
    // This chunk's put part has ended with `why`: no kChunk or FIN goes for bytes that never
    // moved; the receiver hears of the first failure, and the last chunk ends the FIN's part.
    auto give_up = [&](const Status& why) {
      if (!*failed) fail_receiver(p, receiver_id, why);
      *failed = true;
      if (last) part_done(why);
    };
    if (!st.ok()) {
      part_done(st);
      return give_up(st);
    }
    void* req = nullptr;
    int rc = p.net->net->put(p.net->state, p.conn, src + off, len, nullptr, key->data(), key->size(), off, &req);
    if (Status refused = track(p, rc, req, part_done, "put"); !refused.ok()) return give_up(refused);
    if (n > 1) post_msg(p, MsgType::kChunk, 0, receiver_id, off, len, nullptr, 0, nullptr);
    if (last) post_msg(p, MsgType::kFin, 0, receiver_id, bytes, 0, nullptr, 0, part_done);
  };
  for (std::size_t k = 0; k < n; ++k) {
    if (!staging) {
      landed(k, {});
      continue;
    }
    const std::size_t off = k * chunk, len = std::min(chunk, s.bytes - off);
    Status q = dev_.copy_async(from.provider, from.device, staging + off, s.buf + off, len,
                               [landed, k](const Status& st) { landed(k, st); });
    if (q.ok()) continue;
    for (; k < n; ++k) landed(k, q);  // this chunk and the ones never queued
  }
}

void CommImpl::on_chunk(Peer& p, uint64_t id, uint64_t offset, uint64_t len) {
  auto it = p.rndv_recvs.find(id);
  if (it == p.rndv_recvs.end()) return;
  RecvOp& r = it->second;
  r.chunked = true;
  if (!r.staged) return;  // a host receive: the bytes are already where they belong
  if (offset > r.bytes || len > r.bytes - offset) {
    if (r.error.ok()) r.error = {ErrorCode::kInternal, "a chunk from " + describe(p) + " lies outside the receive"};
    return;
  }
  const ContextImpl::MemInfo to = ctx_.mem_info(r.buf, r.bytes);
  ++r.copies;
  Status q = dev_.copy_async(to.provider, to.device, r.buf + offset, r.staged + offset, len,
                             [this, &p, id, from = r.staged](const Status& st) {
    auto it = p.rndv_recvs.find(id);
    if (it == p.rndv_recvs.end() || it->second.staged != from) {  // the receive ended early
      auto d = draining_.find(from);
      if (d != draining_.end() && --d->second == 0) {
        dev_.release(from);
        draining_.erase(d);
      }
      return;
    }
    RecvOp& r = it->second;
    --r.copies;
    if (!st.ok() && r.error.ok()) r.error = st;
    if (r.fin && r.copies == 0) finish_rndv_recv(p, id, r.fin_size);
  });
  if (!q.ok()) {
    --r.copies;
    if (r.error.ok()) r.error = q;
  }
}

void CommImpl::finish_rndv_recv(Peer& p, uint64_t id, uint64_t size) {
  auto it = p.rndv_recvs.find(id);
  if (it == p.rndv_recvs.end()) return;
  RecvOp& r = it->second;
  // A FIN no sender owes (this side's own get is all that still writes into the buffer)
  // or one of a size the receive did not agree to comes from a broken peer: the receive
  // fails, once the get ended, rather than end while memory is still being written or
  // report bytes it never got.
  auto broken = [&](const std::string& what) {
    if (r.error.ok()) r.error = {ErrorCode::kInternal, describe(p) + " sent " + what};
  };
  if (r.getting && r.parts < 2) return broken("a FIN for a receive that its get still fills");
  if (r.parts > 0) {  // a split receive: the FIN of the sender's part
    if (--r.parts > 0) return;  // the get of the rest (or a put in its place) still runs
    size = r.bytes;
  }
  if (size != r.bytes) {
    broken("a FIN of " + std::to_string(size) + " bytes for a receive of " + std::to_string(r.bytes));
    size = r.bytes;
  }
  if (r.copies > 0) {  // staged chunks still on their way to the device
    r.fin = true;
    r.fin_size = size;
    return;
  }
  Status s = r.error;
  if (s.ok() && r.staged && !r.chunked) s = ctx_.copy(r.buf, r.staged, size);
  release_recv(p, r);
  if (s.ok()) r.op->complete(size);
  else r.op->fail(s);
  p.rndv_recvs.erase(it);
}

// Offer the receive buffer as IPC memory when the sender shares this host, one side holds
// device memory, and the sender has the provider that exported it.
std::optional<IpcOffer> CommImpl::ipc_offer(const Peer& p, const RecvOp& r, uint64_t rts_flags) {
  if (!p.ipc_ok || !(r.device || (rts_flags & kRtsFromDevice))) return std::nullopt;
  auto offer = dev_.offer(r.buf, r.bytes);
  if (!offer || p.ipc_refused.count(offer_key(*offer))) return std::nullopt;
  bool peer_has = offer->provider == "cpu" ||
                  std::any_of(p.card.devices.begin(), p.card.devices.end(),
                              [&](const DeviceInfo& d) { return d.id.provider == offer->provider; });
  return peer_has ? offer : std::nullopt;
}

void CommImpl::on_cts_ipc(Peer& p, const WireHeader& h, const uint8_t* payload, std::size_t len) {
  // Out of the table before the write: a copy that ends at once runs `fin`, and the peer
  // may be found lost then (mark_lost clears the table).
  std::optional<SendOp> taken = take_send(p, h.id);
  if (!taken) return;
  auto offer = decode_offer(payload, len);
  SendOp op = *taken;
  // Ends the send once the bytes are in the peer's memory (now, or when the stream copy ends).
  auto fin = [this, &p, op, receiver_id = h.aux](const Status& s) {
    if (!p.lost.ok()) return op.op->fail(p.lost);
    if (!s.ok()) {
      fail_receiver(p, receiver_id, s);
      return op.op->fail(s);
    }
    post_msg(p, MsgType::kFin, 0, receiver_id, op.bytes, 0, nullptr, 0, [op = op.op, bytes = op.bytes](const Status& st) {
      if (st.ok()) op->complete(bytes);
      else op->fail(st);
    });
  };
  Status s = offer ? dev_.write(p.info, offer.value(), op.buf, op.bytes, fin) : offer.status();
  if (s.code() == ErrorCode::kUnsupported) {
    // This process cannot import that memory of the peer: ask for a plain CTS. The peer
    // stages that buffer from then on; past kIpcStrikes such buffers, every one.
    const bool off = ++p.ipc_strikes >= Peer::kIpcStrikes;
    if (off) p.ipc_ok = false;
    const std::string said = fmt::format("IPC with {} refused ({}); {}", describe(p), s.message(),
                                         off ? "staging through " + p.path.provider + " from now on"
                                             : std::string("that buffer is staged"));
    // The first refusal and the last are warnings, those between said at debug.
    if (off || p.ipc_strikes == 1) HMC_LOG("core", warn, "{}", said);
    else HMC_LOG("core", debug, "{}", said);
    p.rndv_sends[h.id] = op;  // the plain CTS asked for here finds it again
    std::string text = reason_text(s);
    return post_msg(p, MsgType::kCtsRefused, 0, h.aux, h.id, 0, text.data(), text.size(), nullptr);
  }
  if (!s.ok()) fin(s);
}

void CommImpl::on_cts_refused(Peer& p, const WireHeader& h, const uint8_t* payload, std::size_t len) {
  auto it = p.rndv_recvs.find(h.id);
  if (it == p.rndv_recvs.end()) return;
  std::string why(payload, payload + len);
  if (h.aux != 0) {  // the sender failed: so does this receive
    Status failed{static_cast<ErrorCode>(h.aux), "rank " + std::to_string(p.rank) + " could not send: " + why};
    if (RecvOp& r = it->second; r.getting) {  // a split receive's get still writes: fail when it ends (on_got)
      if (r.error.ok()) r.error = failed;
      return;
    }
    if (RecvOp& r = it->second; r.copies > 0) {  // fail once the chunks that came are copied
      if (r.error.ok()) r.error = failed;
      r.fin = true;
      return;
    }
    release_recv(p, it->second);
    it->second.op->fail(failed);
    p.rndv_recvs.erase(it);
    return;
  }
  // Offer the buffer again without IPC; the refusal carries the sender's op id in size.
  RecvOp r = std::move(it->second);
  p.rndv_recvs.erase(it);
  if (r.ipc_key) p.ipc_refused.insert(r.ipc_key);
  if (++p.ipc_strikes >= Peer::kIpcStrikes) p.ipc_ok = false;
  const uint64_t sender_id = h.size, size = r.bytes;
  start_rndv_recv(p, std::move(r), sender_id, size, 0);
}

void CommImpl::handle_msg(Peer& p, const uint8_t* buf, std::size_t len) {
  WireHeader h;
  if (len < sizeof(h)) return mark_lost(p, {ErrorCode::kInternal, "short control message from " + describe(p)});
  std::memcpy(&h, buf, sizeof(h));
  const uint8_t* payload = buf + sizeof(h);
  std::size_t payload_len = len - sizeof(h);
  if (h.magic != kWireMagic) return mark_lost(p, {ErrorCode::kInternal, "garbled control message from " + describe(p)});
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::kEager:
    case MsgType::kRts: {
      bool eager = static_cast<MsgType>(h.type) == MsgType::kEager;
      // An RTS of at most the eager limit may be a message its sender could not send
      // eagerly: what this side owes goes back now, not only at the next quarter.
      if (!eager && h.size <= p.path.eager_limit && p.credit_owed > 0) give_back_credit(p);
      for (auto it = p.posted.begin(); it != p.posted.end(); ++it) {
        if (it->tag != h.tag) continue;
        RecvOp r = std::move(*it);
        p.posted.erase(it);
        if (eager) deliver_eager(p, r, payload, payload_len);
        else start_rndv_recv(p, std::move(r), h.id, h.size, h.aux, payload, payload_len);
        return;
      }
      if (!eager && refuse_unreceived_.load()) return refuse_unreceived(p, h.id, h.size);
      // An RTS keeps only what kRtsGet carries (the sender's key).
      const bool keep = eager || (h.aux & kRtsGet);
      p.unexpected.push_back({static_cast<MsgType>(h.type), h.tag, eager ? payload_len : h.size, h.id, h.aux,
                              keep ? std::vector<uint8_t>(payload, payload + payload_len) : std::vector<uint8_t>{}});
      return;
    }
    case MsgType::kCts: return on_cts(p, h, payload, payload_len);
    case MsgType::kCtsIpc: return on_cts_ipc(p, h, payload, payload_len);
    case MsgType::kCtsRefused: return on_cts_refused(p, h, payload, payload_len);
    case MsgType::kFin: return finish_rndv_recv(p, h.id, h.size);
    case MsgType::kChunk: return on_chunk(p, h.id, h.size, h.aux);
    case MsgType::kNak: {  // a refusal without an error code is still a failure
      const auto code = h.aux != 0 ? static_cast<ErrorCode>(h.aux) : ErrorCode::kInternal;
      if (auto s = take_send(p, h.id))
        s->op->fail({code, "rank " + std::to_string(p.rank) + " refused the message: " + std::string(payload, payload + payload_len)});
      return;
    }
    case MsgType::kGetDone: return on_get_done(p, h);
    case MsgType::kCredit: return on_credit(p, h.aux);
    case MsgType::kNotify: p.notifications.push_back(h.aux); return;
  }
  HMC_LOG("core", warn, "unknown control message type {} from {}", h.type, describe(p));
}

// After abort() every pending operation fails with kAborted (communicator.h), whatever
// the connections it closes report meanwhile: a peer that saw this rank abort may close
// its end first, and a send held for credit used to fail with kPeerLost then.
Status CommImpl::aborted_if_closing(Status s) const {
  if (s.ok() || s.code() == ErrorCode::kAborted || state_.load() != 2) return s;
  return {ErrorCode::kAborted, "communicator was aborted (" + s.message() + ")"};
}

void CommImpl::mark_lost(Peer& p, Status why) {
  if (!p.lost.ok()) return;
  if (why.code() != ErrorCode::kPeerLost && why.code() != ErrorCode::kAborted)
    why = {ErrorCode::kPeerLost, why.message()};
  if (why.message().find("rank " + std::to_string(p.rank)) == std::string::npos)
    why = {why.code(), describe(p) + ": " + why.message()};
  why = aborted_if_closing(why);
  // Once finalize reached its barrier, or after abort, closing connections is expected.
  if (state_.load() == 0 && !finalizing_.load()) HMC_LOG("core", warn, "peer lost: {}", why.message());
  else HMC_LOG("core", debug, "peer closing: {}", why.message());
  p.lost = why;
  if (segments_ && why.code() == ErrorCode::kAborted) segments_->fail(why);  // closing (aborted_if_closing, CLOSED)
  else if (segments_) segments_->lose(p.rank, why);
  fail_pending(p, why);
  // The handle goes with the connection: a provider may give its address to a connection
  // made later (another communicator's), which a stale send would then reach.
  if (p.net && p.conn) p.net->net->close_conn(p.net->state, p.conn);
  p.conn = nullptr;
}

bool CommImpl::ended(Peer& p, void* req, const OnEnd& end) {
  int finished = 0;
  std::size_t bytes = 0;
  char message[256];
  message[0] = 0;  // not the whole buffer: this runs for every request in flight on every poll
  int rc = p.net->net->test(p.net->state, req, &finished, &bytes, message, sizeof(message));
  if (rc == 0 && !finished) return false;
  message[sizeof(message) - 1] = 0;  // a provider that filled it to the end
  Status s = rc == 0 ? Status{} : aborted_if_closing(from_provider(rc, message, describe(p)));
  end(s);
  if (rc == HMC_PROV_ERR_PEER_LOST) lose(p, s);
  return true;
}

void CommImpl::lose(Peer& p, const Status& why) {
  if (!p.lost.ok()) return;
  if (p.ending.ok()) p.ending = why;
  events_.rescan();  // outside a pass: the next one drains, then marks the loss
}

void CommImpl::repost_ctrl(Peer& p) {
  p.repost = false;
  for (std::size_t k = 0; k < p.ctrl.size() && p.lost.ok(); ++k) {
    CtrlSlot& slot = p.ctrl[(p.next_ctrl + k) % p.ctrl.size()];
    if (!slot.req) post_ctrl_recv(p, slot);
  }
}

bool CommImpl::progress_peer(Peer& p) {
  bool any = progress_peer_pass(p);
  // The connection failed (a send or receive refused, a request failed): what it had
  // delivered before is taken first, into the slots still posted and through the
  // provider's queue, in passes while they find something; then the loss.
  if (!p.ending.ok()) {
    for (int pass = 0; pass < kDrainPasses && p.lost.ok() && progress_peer_pass(p); ++pass) any = true;
    if (p.lost.ok()) mark_lost(p, p.ending);
    p.ending = {};
  }
  return any;
}

bool CommImpl::progress_peer_pass(Peer& p) {
  if (p.repost) repost_ctrl(p);
  bool any = release_held(p);  // the sends whose wait for credit ended
  char message[256];
  if (!p.inflight.empty()) {
    auto& current = p.inflight_scan;  // swapped in, so neither vector gives up its storage
    current.clear();
    std::swap(current, p.inflight);
    for (auto& f : current) {
      if (!ended(p, f.req, f.end)) { p.inflight.push_back(std::move(f)); continue; }
      any = true;
    }
    current.clear();
  }
  while (!p.ctrl.empty()) {
    CtrlSlot& slot = p.ctrl[p.next_ctrl];
    // Every slot took a message in this pass: post them again and go on, so a pass still
    // takes all that waits (a lost peer's last messages are drained in kDrainPasses).
    if (!slot.req && p.repost) repost_ctrl(p);
    if (!slot.req) break;
    int done = 0;
    std::size_t bytes = 0;
    message[0] = 0;
    int rc = p.net->net->test(p.net->state, slot.req, &done, &bytes, message, sizeof(message));
    if (rc == 0 && !done) break;
    any = true;
    slot.req = nullptr;
    message[sizeof(message) - 1] = 0;
    if (rc == 0 && bytes > slot.buf.size()) {  // the provider's fault: nothing past the slot is read
      mark_lost(p, {ErrorCode::kInternal, describe(p) + ": " + p.net->name + " reported " + std::to_string(bytes) +
                                              " bytes received into a buffer of " + std::to_string(slot.buf.size())});
      p.next_ctrl = (p.next_ctrl + 1) % p.ctrl.size();
      continue;
    }
    if (rc != 0) {
      mark_lost(p, from_provider(rc, message, describe(p)));
      p.next_ctrl = (p.next_ctrl + 1) % p.ctrl.size();
      continue;
    }
    handle_msg(p, slot.buf.data(), bytes);
    p.repost = true;
    p.next_ctrl = (p.next_ctrl + 1) % p.ctrl.size();
  }
  return any;
}

bool CommImpl::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || state_.load() != 0) return false;
  bool any = dev_.poll();
  if (events_.due()) {
    for (auto& p : peers_) {
      if (!p.net) continue;
      any |= progress_peer(p);
      if (p.repost || !p.held.empty()) events_.rescan();
    }
  }
  // The control plane may learn of a peer's end before its connection does, and a
  // provider that reads on a thread of its own (tcp) may not have read the peer's last
  // messages yet: they are taken first. The loss fails what is still pending once the
  // connection has failed too (a final drain takes what it read before), or kLeaveGrace
  // after the control plane's word (a connection that stays up).
  if (lost_changed_.load(std::memory_order_relaxed) && lost_changed_.exchange(false)) {
    for (int r : bootstrap_->lost_peers()) {
      if (r == rank_ || !peers_[r].lost.ok() || peers_[r].leaving) continue;
      peers_[r].leaving = Clock::now() + kLeaveGrace;
      ++leaving_;
    }
  }
  for (std::size_t i = 0; leaving_ > 0 && i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (!p.leaving) continue;
    if (p.lost.ok()) {
      const bool down = !p.net || !p.conn || p.net->net->conn_status(p.net->state, p.conn) < 0;
      for (int pass = 0; p.net && pass < kDrainPasses && progress_peer(p); ++pass) any = true;
      if (p.lost.ok() && (down || Clock::now() >= *p.leaving))
        mark_lost(p, {ErrorCode::kPeerLost, describe(p) + " left the job (control plane lost it)"});
    }
    if (!p.lost.ok()) {  // by now, or by the connection's own word meanwhile
      p.leaving.reset();
      --leaving_;
    }
  }
  // Copies still running on a device count as movement, as in collectives/ccl.cpp: their
  // end wakes nobody, so a waiter that slept through it (up to 1 ms at a time) left the
  // FIN behind it unsent. On 2 H200s one 64 MiB stream in a few ran at 0.93-0.96 of
  // cudaMemcpyPeer for that, and sendrecv stalled for milliseconds at single sizes.
  return any || dev_.busy();
}

}  // namespace hmc::core
