// Split rendezvous: the sender and the receiver copy one half each, at the same time.
//
// A rendezvous by put or by get leaves the whole copy to one rank while the other waits.
// Between ranks of one host whose provider maps both buffers (ucx over shared memory), two
// cores copy a message about twice as fast as one. So from HMC_RNDV_SPLIT up, a receiver
// that matched a kRtsGet (the sender's key) answers with a CTS that carries its own key and
// kCtsSplit, and starts getting the second half right after: the sender puts the first
// half [0, head) and sends kFin for it; the receiver's get ends with kGetDone. The receive
// is done when its get and that FIN both are (RecvOp::parts); the send when its put, its
// FIN and the kGetDone are (SendOp::split_parts).
//
// Only where the other side's core would wait otherwise: a sender with a rendezvous receive
// of its own under way does not offer (no kRtsSplit), and a receiver with a rendezvous send
// of its own under way does not take the offer; there both ranks copy already (a sendrecv,
// a ring), and a split only adds control messages (2 ranks exchanging 128-512 KiB over ucx:
// 15-25 % slower split). HMC_RNDV=split splits regardless.
//
// A receiver whose get fails for any reason but a lost peer asks for the rest by a CTS with
// kCtsRest: the sender puts the second half too (its head's parts still counted) and that
// FIN ends the receive. A receiver that cannot split at all (device memory, a buffer outside
// HMC allocations under HMC_RNDV=auto) gets or asks for a put as before.
#include "core/comm_impl.h"
#include "core/log.h"

namespace hmc::core {

std::size_t CommImpl::split_from_for(const Peer& p, bool same_host) const {
  if (!p.net || !(p.net->net_caps & HMC_NET_CAP_GET)) return SIZE_MAX;
  if (rndv_ == Rndv::kSplit) return 0;
  // Over a network one NIC moves both halves: nothing gained by splitting.
  if (rndv_ != Rndv::kAuto || !same_host || split_min_ == 0 || get_limit_for(p, same_host) == 0) return SIZE_MAX;
  return split_min_;
}

bool CommImpl::start_split(Peer& p, RecvOp& r, uint64_t sender_id, const uint8_t* key, std::size_t key_len) {
  if (r.device || r.bytes < 2 * 64 || r.bytes < p.path.split_from || key_len == 0 ||
      !(p.net->net_caps & HMC_NET_CAP_GET) || busy_with(&Peer::rndv_sends))
    return false;
  std::vector<uint8_t> mine;
  // auto: only buffers whose registration the cache keeps, as for the sender's (offer_get).
  if (Status st = register_buffer(p, r.buf, r.bytes, r.reg, mine, rndv_ == Rndv::kAuto); !st.ok()) {
    if (st.code() != ErrorCode::kUnsupported) HMC_LOG("core", debug, "receive from {} not split: {}", describe(p), st.message());
    return false;
  }
  const std::size_t head = (r.bytes / 2) & ~std::size_t{63};  // whole cache lines each
  const uint64_t id = r.id;
  r.parts = 2;
  r.head = head;
  // The CTS goes first: a provider may copy within get (ucx into mapped memory does), and
  // the sender's half should run meanwhile.
  post_msg(p, MsgType::kCts, kCtsSplit, sender_id, head, id, mine.data(), mine.size(), nullptr);
  r.key = std::move(mine);
  // That send, or an earlier one, found the connection failed (the loss is marked at the
  // end of the next pass over the peer, Peer::ending): nothing will come.
  if (!p.lost.ok() || !p.ending.ok()) {
    const Status why = p.lost.ok() ? p.ending : p.lost;
    release_recv(p, r);
    r.op->fail(why);
    return true;
  }
  RecvOp& kept = p.rndv_recvs[id] = std::move(r);
  void* req = nullptr;
  int rc = p.net->net->get(p.net->state, p.conn, kept.buf + head, kept.bytes - head, nullptr, key, key_len, head, &req);
  if (rc != 0 || !req) {
    // Nothing is being written here: on_got asks for a put of the rest (or fails the
    // receive if the peer is lost).
    Status why = from_provider(rc != 0 ? rc : HMC_PROV_ERR_INTERNAL, nullptr, describe(p));
    on_got(p, id, sender_id, why);
    return true;
  }
  kept.getting = true;
  p.inflight.push_back({req, [this, &p, id, sender_id](const Status& s) { on_got(p, id, sender_id, s); }});
  return true;
}

void CommImpl::on_split_cts(Peer& p, const WireHeader& h, const uint8_t* rkey, std::size_t rkey_len) {
  auto it = p.rndv_sends.find(h.id);
  if (it == p.rndv_sends.end()) return;
  SendOp& s = it->second;
  if (s.split_parts || s.device || h.size == 0 || h.size >= s.bytes) {
    Status bad{ErrorCode::kInternal, "a malformed split CTS from " + describe(p)};
    if (auto taken = take_send(p, h.id)) taken->op->fail(bad);
    return fail_receiver(p, h.aux, bad);
  }
  // Three parts: the head's put, its FIN, and the receiver's kGetDone.
  s.split_parts = std::make_shared<int>(3);
  s.split_done = parts_of(s.op, s.split_parts, s.bytes);
  auto done = s.split_done;
  void* req = nullptr;
  int rc = p.net->net->put(p.net->state, p.conn, s.buf, h.size, nullptr, rkey, rkey_len, 0, &req);
  if (Status refused = track(p, rc, req, done, "put"); !refused.ok()) {
    // The send failed (done ran); the receiver fails too once its get ended, and its
    // kGetDone, if any, finds nothing.
    take_send(p, h.id);
    return fail_receiver(p, h.aux, refused);
  }
  post_msg(p, MsgType::kFin, 0, h.aux, h.size, 0, nullptr, 0, done);
}

}  // namespace hmc::core
