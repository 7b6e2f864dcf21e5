// CommImpl one-sided: registration, puts and their notifications.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/comm_impl.h"

namespace hmc::core {

Status check_extent(const void* ptr, std::size_t bytes, const char* what) {
  if (bytes > UINTPTR_MAX - reinterpret_cast<uintptr_t>(ptr))
    return {ErrorCode::kInvalidArgument,
            what + std::to_string(bytes) + " bytes past the pointer overrun the address space"};
  return {};
}

namespace {

// Host memory that peers will write into must be mapped in this process, all of it: a put
// into an address that is not would kill the process where a provider copies with memcpy.
// msync(MS_ASYNC) checks the pages' mappings and does nothing else.
Status check_mapped(const void* ptr, std::size_t bytes) {
  HMC_RETURN_IF_ERROR(check_extent(ptr, bytes, "register_memory: "));
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = start & ~(page - 1);
  if (msync(reinterpret_cast<void*>(lo), start + bytes - lo, MS_ASYNC) != 0 && errno == ENOMEM)
    return {ErrorCode::kInvalidArgument,
            "register_memory: " + std::to_string(bytes) + " bytes from the pointer are not all memory of this process"};
  return {};
}

}  // namespace

Result<MemoryRegion> CommImpl::register_memory(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mu_);
  HMC_RETURN_IF_ERROR(usable());
  if (!ptr || bytes == 0) return Status(ErrorCode::kInvalidArgument, "register_memory needs a non-null pointer and a size > 0");
  const bool device = ctx_.device_mem(ptr, bytes);
  if (!device) HMC_RETURN_IF_ERROR(check_mapped(ptr, bytes));
  auto reg = std::make_unique<Registration>(ptr, bytes);
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
  op->what = {"put", peer, 0, bytes};
  if (!p.net) {  // self: the key's "self" entry names a live region of this process
    const auto self = k->find("self");
    if (!self) return Operation::failed({ErrorCode::kInvalidArgument, "remote key has no local entry"});
    auto copy = [this](void* dst, const void* from, std::size_t n) { return ctx_.copy(dst, from, n); };
    if (Status s = self_put(*self, offset, src, bytes, copy); !s.ok()) return Operation::failed(s);
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
  // An empty put moves nothing, but one with a notify is a doorbell: the provider checks
  // its key first, as for any put, so that a stale key sends no notification (it did).
  if (bytes == 0 && !notify) {
    op->complete(0);
    return op;
  }
  void* req = nullptr;
  const int rc = p.net->net->put(p.net->state, p.conn, src, bytes, nullptr, rkey->data(), rkey->size(), offset, &req);
  // A put copied within the call (shm, ucx through a mapping) has ended already: done now,
  // its NOTIFY sent now, and nothing kept for a pass to find.
  Status now;
  bool ended_now = true;
  if (rc != 0 || !req) now = track(p, rc, req, nullptr, "put");  // refused (or no request): its error
  else ended_now = ended(p, req, [&now](const Status& st) { now = st; });
  if (ended_now) {
    if (!now.ok()) op->fail(now);
    else if (notify) notify_after_puts(p, *notify, OnEnd::completes_with(op, bytes));
    else op->complete(bytes);
    return op;
  }
  // Still landing. The NOTIFY waits for the put to complete (the data is in the peer's
  // memory), not only for the ordering contract: a put the target refuses late (a key it no
  // longer knows) then fails here and notifies nobody, where a NOTIFY sent behind it would
  // still arrive. A device source's host copy lives until the put ends.
  if (!notify) {
    if (!host) (void)track(p, rc, req, OnEnd::completes_with(op, bytes), "put");
    else (void)track(p, rc, req, [op, bytes, host](const Status& st) { st.ok() ? op->complete(bytes) : op->fail(st); }, "put");
    return op;
  }
  auto pending = std::make_shared<PendingNotify>(PendingNotify{*notify, PendingNotify::kWaiting, OnEnd::completes_with(op, bytes)});
  p.notify_after.push_back(pending);
  (void)track(p, rc, req, [this, peer, op, pending, host](const Status& st) {
    pending->state = st.ok() ? PendingNotify::kReady : PendingNotify::kDropped;
    if (!st.ok()) op->fail(st);
    release_notifies(peers_[peer]);
  }, "put");
  return op;
}

void CommImpl::notify_after_puts(Peer& p, uint64_t value, OnEnd done) {
  if (p.notify_after.empty()) return send_notify(p, value, std::move(done));
  p.notify_after.push_back(std::make_shared<PendingNotify>(PendingNotify{value, PendingNotify::kReady, std::move(done)}));
  release_notifies(p);
}

void CommImpl::send_notify(Peer& p, uint64_t value, OnEnd done) {
  if (!p.lost.ok() || !p.conn) done(p.lost.ok() ? Status(ErrorCode::kAborted, "connection closed") : p.lost);
  else post_msg(p, MsgType::kNotify, 0, 0, 0, value, nullptr, 0, std::move(done));
}

void CommImpl::release_notifies(Peer& p) {
  while (!p.notify_after.empty() && p.notify_after.front()->state != PendingNotify::kWaiting) {
    auto next = std::move(p.notify_after.front());
    p.notify_after.pop_front();
    if (next->state == PendingNotify::kReady) send_notify(p, next->value, std::move(next->done));
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
