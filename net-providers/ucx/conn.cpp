// Messages: active messages (id kAmId) with a Wire header, delivered to the
// posted receives of their connection in sequence order.
//
// Each side numbers what it sends on a connection; the receiver handles
// messages strictly in that order (anything early waits in Conn::inbox), so
// control messages (put checks, revocations) keep their place among the
// data. A receive posted before its message arrives gets eager data copied
// straight from UCP's buffer and rendezvous data fetched straight into it;
// otherwise the message waits (UCP's buffer held, or copied when UCP cannot
// hold it). Receives are reported complete in posting order.
#include <cstring>

#include "provider.h"

namespace hmc_ucx {

// The one callback of every operation (user_data = Op). Callbacks run inside
// ucp_worker_progress, so under the provider's lock.
void Provider::on_op_done(Op* op, ucs_status_t status, size_t length) {
  Conn* c = op->conn;
  if (c != nullptr) c->ops.erase(op);
  else orphans_.erase(op);
  const bool ok = status == UCS_OK;
  const bool failed = c != nullptr && c->state == Conn::kFailed;
  const int fail_rc = failed ? c->error : c != nullptr ? HMC_PROV_ERR_PEER_LOST : HMC_PROV_ERR_CLOSED;
  const std::string why = failed ? c->why
                          : c != nullptr ? std::string("peer lost: ") + ucs_status_string(status) + " (" + c->peer + ")"
                                         : std::string("connection closed");
  switch (op->type) {
    case Op::kSend:
      if (op->req == nullptr) break;  // failed when its connection closed (retire)
      if (ok) op->req->complete(op->bytes);
      else op->req->fail(fail_rc, why);
      wake_later();
      break;
    case Op::kRecvData:
      if (op->recv != nullptr) {
        if (ok && op->bounce) std::memcpy(op->recv->buf, op->bounce.get(), op->bytes);
        op->recv->op = nullptr;
        op->recv->landed = true;
        op->recv->bytes = op->bytes;
        if (!ok) {
          op->recv->rc = fail_rc;
          op->recv->why = why;
        }
        if (c != nullptr) complete_ready(*c);
      }
      break;
    case Op::kFlush:
    case Op::kGet:
      if (op->req == nullptr) break;  // failed with its connection (fail, retire)
      if (c != nullptr) {
        put_finished(*c, op->req, op->bytes, ok ? HMC_PROV_OK : fail_rc, why);
      } else {
        op->req->fail(HMC_PROV_ERR_CLOSED, "connection closed");
        wake_later();  // a host asleep in wait() looks again
      }
      break;
    case Op::kPutSend:
      if (c != nullptr) am_put_step(*c, op->put, true, ok ? HMC_PROV_OK : fail_rc, why);
      break;
    case Op::kPutRecv:
      if (c != nullptr && c->carries())
        send_control(*c, Kind::kPutDone, op->put, ok ? kLanded : kLost, 0, ok ? "" : why);
      break;
    case Op::kControl:
      break;
  }
  (void)length;
  delete op;
}

ucp_request_param_t send_param(Op* op) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = op;
  p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* o = static_cast<Op*>(user_data);
    o->provider->on_op_done(o, status, 0);
    ucp_request_free(request);
  };
  return p;
}

// Sends `buf` as one message now (the caller checked that no put is ahead of it).
void Provider::send_now(Conn& c, Op* op, const void* buf, size_t len) {
  op->conn = &c;
  op->wire = Wire{c.peer_id, static_cast<uint32_t>(Kind::kMsg), c.peer_cookie, c.send_seq++, 0, 0, 0};
  op->bytes = len;
  const ucp_request_param_t p = send_param(op);
  void* r = ucp_am_send_nbx(c.ep, kAmId, &op->wire, kMsgWire, buf, len, &p);
  if (r == nullptr) {
    op->req->complete(len);
    delete op;
  } else if (UCS_PTR_IS_ERR(r)) {
    op->req->fail(HMC_PROV_ERR_PEER_LOST, std::string("ucp_am_send_nbx: ") +
                                              ucs_status_string(UCS_PTR_STATUS(r)) + " (" + c.peer + ")");
    delete op;
    broken(c, UCS_PTR_STATUS(r));
  } else {
    c.ops.insert(op);
  }
}

bool Provider::send_at_once(Conn& c, Request* req, const void* buf, size_t len) {
  const Wire wire{c.peer_id, static_cast<uint32_t>(Kind::kMsg), c.peer_cookie, c.send_seq, 0, 0, 0};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  void* r = ucp_am_send_nbx(c.ep, kAmId, &wire, kMsgWire, buf, len, &p);
  if (UCS_PTR_STATUS(r) == UCS_ERR_NO_RESOURCE) return false;
  ++c.send_seq;
  // With this flag ucp_am_send_nbx tries am_short only and answers NO_RESOURCE before it
  // makes a request. Should one come all the same, it ends here, as its header is on this
  // stack: within a second, or the connection is given up (its endpoint closes).
  if (UCS_PTR_IS_PTR(r)) {
    const auto until = Clock::now() + std::chrono::seconds(1);
    ucs_status_t status;
    while ((status = ucp_request_check_status(r)) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
    ucp_request_free(r);
    r = status == UCS_OK ? nullptr : UCS_STATUS_PTR(status == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : status);
  }
  if (r == nullptr) {
    req->complete(len);
    return true;
  }
  const ucs_status_t status = UCS_PTR_STATUS(r);
  req->fail(HMC_PROV_ERR_PEER_LOST, std::string("ucp_am_send_nbx: ") + ucs_status_string(status) + " (" + c.peer + ")");
  broken(c, status);
  return true;
}

void Provider::send_control(Conn& c, Kind kind, uint64_t token, uint64_t arg, uint64_t len,
                            std::string payload) {
  if (c.ep == nullptr) return;
  auto* op = new Op(Op::kControl);
  op->provider = this;
  op->conn = &c;
  op->payload = std::move(payload);
  op->wire = Wire{c.peer_id, static_cast<uint32_t>(kind), c.peer_cookie, c.send_seq++, token, arg, len};
  const ucp_request_param_t p = send_param(op);
  void* r = ucp_am_send_nbx(c.ep, kAmId, &op->wire, sizeof(Wire), op->payload.data(),
                            op->payload.size(), &p);
  if (UCS_PTR_IS_PTR(r)) {
    c.ops.insert(op);
  } else {
    delete op;
    if (UCS_PTR_IS_ERR(r)) broken(c, UCS_PTR_STATUS(r));
  }
}

// A call on the endpoint failed at once: the endpoint is broken, and the message
// numbering with it (the peer would wait for the lost sequence number for ever, and
// with shared memory only no error handler would say so). The connection fails as
// when UCX's error handler reports it: from drive(), outside the callback we may be in.
void Provider::broken(Conn& c, ucs_status_t status) {
  broken_.emplace_back(c.id, status);
}

int Provider::send_msg(void* conn, const void* buf, size_t len, void** req) {
  if (req == nullptr || (buf == nullptr && len > 0) || len > kMaxMessage) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return HMC_PROV_ERR_CLOSED;
  vouch(*c);
  if (c->state == Conn::kFailed) return c->error;
  Request* r = requests_.create();
  *req = r;
  const bool ready = c->state == Conn::kOpen && c->puts == 0 && c->held.empty();
  if (ready && send_at_once(*c, r, buf, len)) {
    unlock_and_wake(lock);
    return HMC_PROV_OK;
  }
  auto* op = new Op(Op::kSend);
  op->provider = this;
  op->conn = c;
  op->req = r;
  op->src = static_cast<const char*>(buf);
  op->bytes = len;
  // Before the connection is up, or behind a put that has not finished: wait.
  if (!ready) {
    c->held.push_back(op);
  } else {
    send_now(*c, op, buf, len);
  }
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

// Sends what waited, in order, up to the next put that is still running.
void Provider::release_held(Conn& c) {
  while (c.state == Conn::kOpen && c.puts == 0 && !c.held.empty()) {
    Op* op = c.held.front();
    c.held.pop_front();
    send_now(c, op, op->src, op->bytes);
  }
}

int Provider::recv_msg(void* conn, void* buf, size_t cap, void** req) {
  if (req == nullptr || (buf == nullptr && cap > 0)) return HMC_PROV_ERR_INVALID;
  std::unique_lock lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return HMC_PROV_ERR_CLOSED;
  vouch(*c);
  if (c->state == Conn::kFailed && c->unexpected.empty()) return c->error;
  *req = c->recvs.emplace_back(static_cast<char*>(buf), cap, requests_.create()).req;
  if (!c->unexpected.empty()) {
    Incoming m = std::move(c->unexpected.front());
    c->unexpected.pop_front();
    Recv& got = c->recvs[c->assigned++];
    assign(*c, got, m);
  }
  unlock_and_wake(lock);
  return HMC_PROV_OK;
}

// In a UCP callback: only the common case (the next message, a receive
// waiting, eager data) is handled here; everything else waits in the inbox
// for pump(), which runs after ucp_worker_progress returns.
ucs_status_t Provider::on_am(const Wire& w, void* data, size_t len, const ucp_am_recv_param_t* param) {
  auto it = conns_.find(w.conn);
  if (it == conns_.end() || it->second->cookie != w.cookie || it->second->state == Conn::kFailed) {
    return UCS_OK;  // a closed connection or a stranger: dropped
  }
  Conn& c = *it->second;
  Incoming m;
  m.wire = w;
  m.len = len;
  m.rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (w.seq < c.recv_seq || c.inbox.contains(w.seq)) return UCS_OK;  // cannot happen with UCP
  if (!m.rndv && w.seq == c.recv_seq && c.inbox.empty() &&
      static_cast<Kind>(w.kind) == Kind::kMsg && c.assigned < c.recvs.size()) {
    m.transient = data;
    ++c.recv_seq;
    assign(c, c.recvs[c.assigned++], m);
    return UCS_OK;
  }
  ucs_status_t keep = UCS_OK;
  if (m.rndv || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA)) {
    m.held = data;
    keep = UCS_INPROGRESS;
  } else {
    m.copy.assign(static_cast<const char*>(data), len);
  }
  c.inbox.emplace(w.seq, std::move(m));
  mark_pending(c);
  return keep;
}

// Outside callbacks: hands out what arrived in sequence order.
void Provider::pump(Conn& c) {
  for (auto e = c.inbox.begin(); c.state != Conn::kFailed && e != c.inbox.end() && e->first == c.recv_seq;
       e = c.inbox.begin()) {
    Incoming next = std::move(e->second);
    c.inbox.erase(e);
    ++c.recv_seq;
    dispatch(c, std::move(next));
  }
  release_held(c);
}

// One message in its turn: control messages act, data goes to a receive.
void Provider::dispatch(Conn& c, Incoming m) {
  const auto kind = static_cast<Kind>(m.wire.kind);
  if (kind == Kind::kMsg) {
    deliver(c, std::move(m));
    return;
  }
  if (kind == Kind::kPutData) {
    on_put_data(c, m);
    return;
  }
  std::string body;
  if (!m.rndv && m.len <= 4096) body.assign(m.bytes(), m.len);  // control messages are small
  drop(m);
  if (kind == Kind::kCheck) on_check(c, m.wire, body);
  else if (kind == Kind::kReply) on_reply(c, m.wire, body);
  else if (kind == Kind::kRevoke) on_revoke(c, m.wire);
  else if (kind == Kind::kMapped) on_mapped(c, m.wire);
  else if (kind == Kind::kMappedAck) on_mapped_ack(c, m.wire);
  else if (kind == Kind::kRevoked) c.owe_revoked.erase(m.wire.token);
  else if (kind == Kind::kPutDone) on_put_done(c, m.wire, body);
}

void Provider::deliver(Conn& c, Incoming m) {
  if (c.assigned < c.recvs.size()) {
    Recv& r = c.recvs[c.assigned++];
    assign(c, r, m);
  } else {
    c.unexpected.push_back(std::move(m));
  }
}

// Gives message `m` to receive `r` (its turn has come); takes m's data.
void Provider::assign(Conn& c, Recv& r, Incoming& m) {
  r.assigned = true;
  if (m.len > r.cap) {
    r.landed = true;
    r.rc = HMC_PROV_ERR_TRUNCATED;
    r.why = "message of " + std::to_string(m.len) + " bytes is larger than the posted " +
            std::to_string(r.cap) + "-byte buffer (dropped)";
    drop(m);
  } else if (m.rndv) {
    auto* op = new Op(Op::kRecvData);
    op->provider = this;
    op->conn = &c;
    op->recv = &r;
    op->bytes = m.len;
    char* dest = r.buf;
    if (!peer_errors_) {
      op->bounce.reset(new char[m.len > 0 ? m.len : 1]);  // not zeroed: UCP fills it
      dest = op->bounce.get();
    }
    void* q = fetch(m, op, dest);
    if (UCS_PTR_IS_PTR(q)) {
      r.op = op;
      c.ops.insert(op);
      return;
    }
    r.landed = true;
    r.bytes = m.len;
    if (op->bounce && !UCS_PTR_IS_ERR(q)) std::memcpy(r.buf, dest, m.len);
    if (UCS_PTR_IS_ERR(q)) {
      r.rc = HMC_PROV_ERR_PEER_LOST;
      r.why = std::string("receive failed: ") + ucs_status_string(UCS_PTR_STATUS(q)) + " (" + c.peer + ")";
    }
    delete op;
  } else {
    if (m.len > 0) std::memcpy(r.buf, m.bytes(), m.len);
    r.landed = true;
    r.bytes = m.len;
    drop(m);
  }
  complete_ready(c);
}

// Starts fetching rendezvous message `m`'s data into `dest` (op: the callback's
// user data). UCP owns the descriptor again afterwards. Returns what
// ucp_am_recv_data_nbx did: a request, an error, or null when it landed at once.
void* Provider::fetch(Incoming& m, Op* op, void* dest) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = op;
  p.cb.recv_am = [](void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* o = static_cast<Op*>(user_data);
    o->provider->on_op_done(o, status, length);
    ucp_request_free(request);
  };
  void* q = ucp_am_recv_data_nbx(worker_, m.held, dest, m.len, &p);
  m.held = nullptr;
  return q;
}

void Provider::complete_ready(Conn& c) {
  while (!c.recvs.empty() && c.recvs.front().landed) {
    Recv& r = c.recvs.front();
    if (r.rc == HMC_PROV_OK) r.req->complete(r.bytes);
    else r.req->fail(r.rc, r.why);
    c.recvs.pop_front();
    --c.assigned;
    wake_later();
  }
}

void Provider::drop(Incoming& m) {
  if (m.held != nullptr) ucp_am_data_release(worker_, m.held);  // rendezvous: declined
  m.held = nullptr;
  m.transient = nullptr;
  m.copy.clear();
}

}  // namespace hmc_ucx
