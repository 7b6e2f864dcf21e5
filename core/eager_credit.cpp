// Eager flow control: a sender that runs ahead of its receiver waits for it.
//
// An eager send completes once its message is handed to the provider, so a sender can run
// arbitrarily far ahead of a receiver whose receives come late: every message it sends
// then waits at the receiver as unexpected, in memory allocated for it. Measured on the
// 2-vCPU VM, a stream of 20000 32 KiB messages over shm (hmc-probe) grew each rank to
// 0.8 GB and moved 0.3-3 GB/s, most of the receiver's time going into the kernel zeroing
// the fresh pages; over tcp 1.2 GB.
//
// So each pair has an eager window (PathInfo::eager_window, HMC_EAGER_WINDOW): the bytes
// of eager messages, each counted with its header, that the sender may have sent and the
// receiver's application not yet received. The receiver counts what its receives consumed
// and gives it back in a kCredit message once that reaches a quarter of the window, or at
// once when an RTS of at most the eager limit comes while it owes anything (the RTS may be
// a message that did not fit). Both sides derive the window alike from the configuration,
// the pair class and the pair's eager limit, as they do the eager limit itself.
//
// A message that does not fit waits for credit (p.held) for up to the pair's credit wait
// (HMC_CREDIT_WAIT), and every later send to that peer waits behind it, as none may
// overtake it to a receive. Held sends start as credit comes; one still short of credit
// when its wait ends goes by rendezvous, whose RTS waits at the receiver without its data:
// a receiver that first waits for a later message (another tag) would otherwise never
// consume the messages that fill the window, and never give credit back. Between hosts a
// rendezvous costs a network round trip: going by rendezvous at once, a tcp stream whose
// receiver lagged sent a third to a half of its 32-64 KiB messages that way and moved
// 12-25 % less. On one host a rendezvous is cheap and has the sender do the copy, which
// relieves a receiver that fell behind, so there the wait is 0 unless set
// (docs/performance.md, "Waiting for credit").
#include <algorithm>

#include "core/comm_impl.h"

namespace hmc::core {
namespace {

std::size_t charge(std::size_t bytes) { return bytes + sizeof(WireHeader); }

}  // namespace

// Unset, HMC_EAGER_WINDOW is 256 KiB between ranks of one host and 1 MiB between hosts,
// whose credit takes longer to come back, and at least sixteen times the pair's eager
// limit (tcp on one host: 1 MiB); set, at least four messages of the eager limit
// (docs/performance.md, "Eager flow control", "Waiting for credit").
std::size_t CommImpl::eager_window_for(const Peer& p, bool same_host) const {
  constexpr std::size_t kRemoteDefault = 1 << 20;
  if (!p.net || eager_window_ == 0) return SIZE_MAX;
  if (ctx_.config().is_set("HMC_EAGER_WINDOW")) return std::max(eager_window_, 4 * charge(p.path.eager_limit));
  return std::max(same_host ? eager_window_ : kRemoteDefault, 16 * p.path.eager_limit);
}

// Unset, HMC_CREDIT_WAIT is 200 us between hosts and 0 between ranks of one host (above).
std::chrono::microseconds CommImpl::credit_wait_for(bool same_host) const {
  if (ctx_.config().is_set("HMC_CREDIT_WAIT")) return credit_wait_;
  return std::chrono::microseconds(same_host ? 0 : 200);
}

// Empty messages carry nothing to buffer (an unexpected one costs what an RTS costs): they
// always go eagerly and are not counted.
bool CommImpl::eager_fits(const Peer& p, std::size_t bytes) const {
  return bytes == 0 || p.path.eager_window == SIZE_MAX || p.eager_credit >= charge(bytes);
}

void CommImpl::spend_eager_credit(Peer& p, std::size_t bytes) {
  if (bytes > 0 && p.path.eager_window != SIZE_MAX) p.eager_credit -= charge(bytes);
}

// Every peer passes here, self too: its window is SIZE_MAX.
void CommImpl::consumed_eager(Peer& p, std::size_t bytes) {
  if (bytes == 0 || p.path.eager_window == SIZE_MAX) return;
  p.credit_owed += charge(bytes);
  if (p.credit_owed >= p.path.eager_window / 4) give_back_credit(p);
}

void CommImpl::give_back_credit(Peer& p) {
  if (!p.lost.ok()) return;
  post_msg(p, MsgType::kCredit, 0, 0, 0, p.credit_owed, nullptr, 0, nullptr);
  p.credit_owed = 0;
}

void CommImpl::on_credit(Peer& p, uint64_t bytes) {
  // Never above the window: a peer configured with a larger one, or a garbled message,
  // cannot buy this side more than its own bound.
  p.eager_credit = bytes >= p.path.eager_window - p.eager_credit ? p.path.eager_window : p.eager_credit + bytes;
  release_held(p);
}

bool CommImpl::short_of_credit(const Peer& p, std::size_t bytes, bool device) const {
  return eager_sized(p, bytes, device) && !eager_fits(p, bytes);
}

bool CommImpl::must_hold(const Peer& p, std::size_t bytes, bool device) const {
  return !p.held.empty() || (p.path.credit_wait.count() > 0 && short_of_credit(p, bytes, device));
}

bool CommImpl::release_held(Peer& p) {
  // Closing (abort, finalize's end): what still waits fails with the communicator.
  if (p.held.empty() || state_.load() != 0) return false;
  const auto now = Clock::now();
  bool any = false;
  // A send refused here fails alone; the loss (Peer::ending), which fails and clears
  // p.held (fail_pending), comes at the end of the pass.
  while (!p.held.empty()) {
    const HeldSend& h = p.held.front();
    if (short_of_credit(p, h.bytes, h.device) && now < h.until) break;
    HeldSend s = std::move(p.held.front());
    p.held.pop_front();
    start_send(p, s.op, s.buf, s.bytes, s.tag, s.device);
    any = true;
  }
  return any;
}

}  // namespace hmc::core
