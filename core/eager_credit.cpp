// Eager flow control: a sender that runs ahead of its receiver sends by rendezvous.
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
// receiver's application not yet received. A message that does not fit goes by
// rendezvous, whose RTS waits at the receiver without its data. The receiver counts what
// its receives consumed and gives it back in a kCredit message once that reaches a quarter
// of the window, or at once when an RTS of at most the eager limit comes while it owes
// anything (the RTS may be a message that did not fit). Both sides derive the window alike from the configuration,
// the pair class and the pair's eager limit, as they do the eager limit itself.
#include <algorithm>

#include "core/comm_impl.h"

namespace hmc::core {
namespace {

std::size_t charge(std::size_t bytes) { return bytes + sizeof(WireHeader); }

}  // namespace

// Unset, HMC_EAGER_WINDOW is 256 KiB between ranks of one host and 1 MiB between hosts,
// whose credit takes longer to come back (docs/performance.md, "Eager flow control").
std::size_t CommImpl::eager_window_for(const Peer& p, bool same_host) const {
  constexpr std::size_t kRemoteDefault = 1 << 20;
  if (!p.net || eager_window_ == 0) return SIZE_MAX;
  const bool chosen = same_host || ctx_.config().is_set("HMC_EAGER_WINDOW");
  return std::max(chosen ? eager_window_ : kRemoteDefault, 4 * charge(p.path.eager_limit));
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
}

}  // namespace hmc::core
