// Receiver-driven rendezvous: the receiver gets the data from the sender's buffer.
//
// The put rendezvous (p2p.cpp) costs three control messages per transfer (RTS, CTS, FIN)
// and leaves the copy to the sender. Where the path provider can read a peer's registered
// memory directly and advises it for the pair class up to some size (HMC_NET_CAP_GET,
// hmc_net_props_t::rndv_get_max_*: ucx over shared memory, 512 KiB; and from
// rndv_get_from_* up, ucx 1.5 MiB), a send of such a size registers its buffer and sends
// its key with the RTS (kRtsGet); the receiver that matches it reads the data into its own
// buffer and answers kGetDone, which ends the send: two messages, and the copy runs on the
// rank that consumes the data.
//
// A receiver that cannot get (device memory, HMC_RNDV=put on its side, a provider that
// refuses the key) answers with a CTS as to any RTS, and the sender puts. A get that fails
// for any reason but a lost peer falls back the same way; one that fails with the peer
// lost fails the receive. Until the get ends, the receive stays in p.rndv_recvs and its
// buffer is written: a lost peer fails it only once its get has ended (fail_pending).
//
// Taking turns (HMC_RNDV_TURNS, PathInfo::turns_from): between ranks of one host a get
// leaves every copy of a one-way stream to the receiver while the sender waits. So from
// HMC_RNDV_TURNS (64 KiB) up, below the split, a receiver that got the last such message
// from a peer answers the next RTS with a CTS, and the sender puts that one: the two ranks
// copy alternate messages at once (docs/performance.md, "Taking turns"; 96 KiB streams
// 27-31 -> 39-46 GB/s on the 2-vCPU VM, 16-24 -> 20-29 on 16 cores; 40 KiB lost there,
// hence the floor). Only in a stream (more from the peer posted for or arrived, or the
// sender has another rendezvous to this rank under way, kRtsMore): a message alone is
// faster by get, two messages instead of three. Only where the next buffer does
// not overlap the last one: two ranks writing the same cache lines at once halved a stream
// into one buffer (29 -> 14 GB/s at 64 KiB). As for a split, only where neither core
// copies already: the sender offers its turn (kRtsTurn) only with no rendezvous receive of
// its own under way, and a receiver with a rendezvous send under way gets.
#include <algorithm>

#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::core {

std::size_t CommImpl::get_limit_for(const Peer& p, bool same_host) const {
  if (!p.net || !(p.net->net_caps & HMC_NET_CAP_GET) || rndv_ == Rndv::kPut) return 0;
  if (rndv_ == Rndv::kGet) return SIZE_MAX;
  const hmc_net_props_t& props = p.net->net_props;
  return same_host ? props.rndv_get_max_same_host : props.rndv_get_max_remote;
}

std::size_t CommImpl::get_from_for(const Peer& p, bool same_host) const {
  if (rndv_ != Rndv::kAuto || get_limit_for(p, same_host) == 0) return SIZE_MAX;
  const hmc_net_props_t& props = p.net->net_props;
  const std::size_t from = same_host ? props.rndv_get_from_same_host : props.rndv_get_from_remote;
  return from == 0 ? SIZE_MAX : from;
}

std::size_t CommImpl::turns_from_for(const Peer& p, bool same_host) const {
  if (turns_min_ == 0 || rndv_ != Rndv::kAuto || !same_host || get_limit_for(p, same_host) == 0) return SIZE_MAX;
  return turns_min_;
}

bool CommImpl::senders_turn(Peer& p, const RecvOp& r, uint64_t rts_flags) {
  const auto last = p.last_rndv;
  p.last_rndv = {r.buf, r.bytes, false};
  if (!(rts_flags & kRtsTurn) || r.bytes < p.path.turns_from || r.device || last.by_put || !last.buf ||
      busy_with(&Peer::rndv_sends))
    return false;
  if (r.buf < last.buf + last.len && last.buf < r.buf + r.bytes) return false;
  // Only in a stream, where more from this peer is on its way (a receive of that size posted
  // for it, or its RTS here) or its sender has others under way (kRtsMore): a message alone
  // by put would take the CTS's round trip. A receiver that takes several RTSs in one pass
  // has matched its posted receives by the last of them; without the sender's word, 9 % of
  // a 64 KiB stream's messages, and 46 % where a get's GET_DONE left in its own pass, were
  // got as if alone (docs/performance.md, "Turns in a stream").
  const std::size_t from = p.path.turns_from;
  if (!(rts_flags & kRtsMore) &&
      std::none_of(p.posted.begin(), p.posted.end(), [from](const RecvOp& q) { return q.bytes >= from; }) &&
      std::none_of(p.unexpected.begin(), p.unexpected.end(), [](const Unexpected& u) { return u.type == MsgType::kRts; }))
    return false;
  // The CTS registers the buffer: only where the cache keeps that (as offer_get).
  if (!ctx_.owns(r.buf, r.bytes)) return false;
  p.last_rndv.by_put = true;
  return true;
}

bool CommImpl::offer_get(Peer& p, SendOp& s, std::vector<uint8_t>& rkey) {
  // auto: only buffers whose registration the cache keeps (HMC allocations); registering
  // the application's own memory for every send would cost more than the get saves. The
  // provider only reads through this registration; reg_mem takes a non-const pointer.
  Status st = register_buffer(p, const_cast<uint8_t*>(s.buf), s.bytes, s.reg, rkey, rndv_ == Rndv::kAuto);
  if (st.ok()) return true;
  if (st.code() != ErrorCode::kUnsupported) HMC_LOG("core", debug, "send to {} goes by put: {}", describe(p), st.message());
  rkey.clear();
  return false;
}

bool CommImpl::start_get(Peer& p, RecvOp& r, uint64_t sender_id, const uint8_t* key, std::size_t key_len) {
  if (r.device || rndv_ == Rndv::kPut || !(p.net->net_caps & HMC_NET_CAP_GET) || key_len == 0) return false;
  void* req = nullptr;
  int rc = p.net->net->get(p.net->state, p.conn, r.buf, r.bytes, nullptr, key, key_len, 0, &req);
  if (rc != 0 || !req) return false;  // the CTS that follows finds out about a lost peer
  const uint64_t id = r.id;
  r.getting = true;
  p.rndv_recvs[id] = std::move(r);
  p.inflight.push_back({req, [this, &p, id, sender_id](const Status& s) { on_got(p, id, sender_id, s); }});
  return true;
}

void CommImpl::on_got(Peer& p, uint64_t id, uint64_t sender_id, const Status& s) {
  auto it = p.rndv_recvs.find(id);
  if (it == p.rndv_recvs.end()) return;
  RecvOp& r = it->second;
  r.getting = false;
  if (s.ok() && r.error.ok()) {
    // Out of the map before the GET_DONE: once the peer is marked lost, what is still there
    // fails and is erased (all of this receive's bytes are here).
    // A split receive still waiting for the FIN of the sender's part stays (RecvOp::parts).
    const uint64_t bytes = r.bytes;
    std::optional<RecvOp> done;
    if (r.parts == 0 || --r.parts == 0) {
      done = std::move(r);
      p.rndv_recvs.erase(it);
    }
    post_msg(p, MsgType::kGetDone, 0, sender_id, bytes, 0, nullptr, 0, nullptr);
    if (!done) return;
    release_recv(p, *done);
    done->op->complete(bytes);
    return;
  }
  const bool lost = !r.error.ok() || s.code() == ErrorCode::kPeerLost || s.code() == ErrorCode::kAborted;
  if (lost) {
    release_recv(p, r);
    r.op->fail(r.error.ok() ? s : r.error);
    p.rndv_recvs.erase(it);
    return;
  }
  if (r.parts > 0) {  // split: the sender puts the rest too; its FIN takes this part's place
    HMC_LOG("core", debug, "get from {} failed ({}); asking for a put of the rest", describe(p), s.message());
    post_msg(p, MsgType::kCts, kCtsRest, sender_id, r.head, id, r.key.data(), r.key.size(), nullptr);  // r may be gone after
    return;
  }
  // The provider could not read the sender's buffer: ask for a put, as to a plain RTS.
  HMC_LOG("core", debug, "get from {} failed ({}); asking for a put", describe(p), s.message());
  RecvOp again = std::move(r);
  p.rndv_recvs.erase(it);
  const uint64_t size = again.bytes;
  start_rndv_recv(p, std::move(again), sender_id, size, 0);
}

void CommImpl::on_get_done(Peer& p, const WireHeader& h) {
  auto s = take_send(p, h.id);
  if (!s) return;
  if (s->split_done) s->split_done({});  // the head's put and FIN may still run
  else s->op->complete(s->bytes);
}

std::optional<CommImpl::SendOp> CommImpl::take_send(Peer& p, uint64_t id) {
  auto it = p.rndv_sends.find(id);
  if (it == p.rndv_sends.end()) return std::nullopt;
  SendOp s = std::move(it->second);
  p.rndv_sends.erase(it);
  release_reg(p, s.reg);
  return s;
}

}  // namespace hmc::core
