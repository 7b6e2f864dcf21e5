// CommImpl one-sided: registration, puts and their notifications.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/comm_impl.h"

namespace hmc::core {

Result<MemoryRegion> CommImpl::register_memory(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mu_);
  HMC_RETURN_IF_ERROR(usable());
  if (!ptr || bytes == 0) return Status(ErrorCode::kInvalidArgument, "register_memory needs a non-null pointer and a size > 0");
  auto reg = std::make_unique<Registration>(ptr, bytes);
  const bool device = ctx_.device_mem(ptr, bytes);
  std::vector<LoadedProvider*> used;
  for (auto& p : peers_)
    if (p.net && std::find(used.begin(), used.end(), p.net) == used.end()) used.push_back(p.net);
  for (LoadedProvider* n : used) {
    if (device && !(n->net_caps & (HMC_NET_CAP_MEM_DMABUF | HMC_NET_CAP_MEM_PEER)))
      return Status(ErrorCode::kUnsupported, "one-sided puts into device memory need a net provider that touches it; " +
                                                 n->name + " reaches only host memory (send/recv stage device memory)");
    HMC_RETURN_IF_ERROR(reg->add(n, device ? HMC_MEM_DEVICE : HMC_MEM_HOST));
  }
  return MemoryRegion(std::move(reg));
}

std::shared_ptr<Operation> CommImpl::put(int peer, const void* src, std::size_t bytes, const RemoteKey& key,
                                         uint64_t offset, std::optional<uint64_t> notify) {
  std::lock_guard lock(mu_);
  if (Status s = usable(); !s.ok()) return Operation::failed(s);
  Peer& p = peers_[peer];
  if (!p.lost.ok()) return Operation::failed(p.lost);
  auto k = unpack_key(key.bytes);
  if (!k) return Operation::failed(k.status());
  if (offset > k->region_bytes || bytes > k->region_bytes - offset)
    return Operation::failed({ErrorCode::kOutOfBounds, "put of " + std::to_string(bytes) + " bytes at offset " +
                                                           std::to_string(offset) + " overruns the peer's region of " +
                                                           std::to_string(k->region_bytes) + " bytes"});
  auto op = Operation::make(ctx_.engine());
  if (!p.net) {  // self: the key's "self" entry is {pid, address}
    const auto self = k->find("self");
    int64_t pid = 0;
    uint64_t addr = 0;
    if (!self || self->size() != 16) return Operation::failed({ErrorCode::kInvalidArgument, "remote key has no local entry"});
    std::memcpy(&pid, self->data(), 8);
    std::memcpy(&addr, self->data() + 8, 8);
    if (pid != getpid()) return Operation::failed({ErrorCode::kInvalidArgument, "remote key belongs to another process, not this rank"});
    if (Status s = ctx_.copy(reinterpret_cast<uint8_t*>(addr) + offset, src, bytes); !s.ok()) return Operation::failed(s);
    if (notify) p.notifications.push_back(*notify);
    op->complete(bytes);
    return op;
  }
  const auto rkey = k->find(p.path.provider);
  if (!rkey) return Operation::failed({ErrorCode::kInvalidArgument, "remote key has no entry for " + p.path.provider +
                                                                         " (registered by another communicator?)"});
  // A device source is copied to the host first; the copy lives until the put is done.
  std::shared_ptr<std::vector<uint8_t>> host;
  if (bytes && ctx_.device_mem(src, bytes)) {
    host = std::make_shared<std::vector<uint8_t>>(bytes);
    if (Status s = ctx_.copy(host->data(), src, bytes); !s.ok()) return Operation::failed(s);
    src = host->data();
  }
  if (!notify && bytes == 0) {
    op->complete(0);
    return op;
  }
  if (!notify && !host) {  // the usual put: nothing to hold but the operation
    OnEnd end = OnEnd::completes_with(op, bytes);
    void* req = nullptr;
    int rc = p.net->net->put(p.net->state, p.conn, src, bytes, nullptr, rkey->data(), rkey->size(), offset, &req);
    // A put copied within the call (shm) has ended already: done now, not a pass later.
    if (rc == 0 && req && ended(p, req, end)) return op;
    (void)track(p, rc, req, std::move(end), "put");
    return op;
  }
  auto parts = std::make_shared<int>((bytes ? 1 : 0) + (notify ? 1 : 0));
  auto part_done = [op, parts, bytes, host](const Status& st) {
    if (!st.ok()) op->fail(st);
    else if (--*parts == 0) op->complete(bytes);
  };
  // The NOTIFY waits for its put to complete (the data is in the peer's memory), not only
  // for the ordering contract: a put the target refuses late (a key it no longer knows)
  // then fails here and notifies nobody, where a NOTIFY sent behind it would still arrive.
  std::shared_ptr<PendingNotify> pending;
  if (notify) {
    const auto state = bytes ? PendingNotify::kWaiting : PendingNotify::kReady;
    pending = std::make_shared<PendingNotify>(PendingNotify{*notify, state, part_done});
    p.notify_after.push_back(pending);
  }
  if (bytes) {
    auto put_done = [this, peer, pending, part_done](const Status& st) {
      if (pending) pending->state = st.ok() ? PendingNotify::kReady : PendingNotify::kDropped;
      part_done(st);
      if (pending) release_notifies(peers_[peer]);
    };
    void* req = nullptr;
    int rc = p.net->net->put(p.net->state, p.conn, src, bytes, nullptr, rkey->data(), rkey->size(), offset, &req);
    // A put copied within the call (shm) has ended already: its NOTIFY need not wait for a pass.
    if (rc == 0 && req && pending && ended(p, req, put_done)) return op;
    (void)track(p, rc, req, std::move(put_done), "put");
    return op;
  }
  release_notifies(p);
  return op;
}

void CommImpl::release_notifies(Peer& p) {
  while (!p.notify_after.empty() && p.notify_after.front()->state != PendingNotify::kWaiting) {
    auto next = std::move(p.notify_after.front());
    p.notify_after.pop_front();
    if (next->state != PendingNotify::kReady) continue;
    if (!p.lost.ok() || !p.conn) next->done(p.lost.ok() ? Status(ErrorCode::kAborted, "connection closed") : p.lost);
    else post_msg(p, MsgType::kNotify, 0, 0, 0, next->value, nullptr, 0, next->done);
  }
}

Result<uint64_t> CommImpl::wait_notify(int peer, Clock::time_point deadline) {
  uint64_t value = 0;
  Status failure;
  bool got = ctx_.engine()->wait_until([&] {
    std::lock_guard lock(mu_);
    if (Status s = usable(); !s.ok()) { failure = s; return true; }
    Peer& p = peers_[peer];
    if (!p.notifications.empty()) {
      value = p.notifications.front();
      p.notifications.pop_front();
      return true;
    }
    if (!p.lost.ok()) { failure = p.lost; return true; }
    return false;
  }, deadline);
  if (!failure.ok()) return failure;
  if (!got) return Status(ErrorCode::kTimeout, "no notification from rank " + std::to_string(peer) + " before the deadline");
  return value;
}

}  // namespace hmc::core
