// Delegation to a vendor collective library (DESIGN.md: homogeneous groups may delegate to
// the vendor CCL). A communicator whose ranks all pass buffers of one collective
// provider's devices (nccl: cuda) hands its collectives to that library, which queues
// them on the device stream; HMC's own schedules run everything else.
//
// Every rank must take the same branch, so the choice depends only on what all ranks share:
// the communicator's state, decided by one exchange among all ranks, and the call's
// arguments (kind, dtype, op, options). The exchange starts at a delegable call while the
// state is undecided: each rank says whether it could delegate (a collective provider is
// loaded and this call's buffer is memory of its device provider). All yes: the vendor
// communicator is made and the state is on. A rank without a collective provider: off for
// good. Otherwise (some buffers on the host) the next delegable calls ask again, up to
// kAgreeTries times. Once on, every delegable call is delegated on every rank; a rank whose
// buffers are elsewhere (host memory, another device) stages them through device scratch.
//
// The exchange does not block the call that starts it: that call, and every delegable call
// made before the exchange ends, returns at once and waits in the link, and once the
// exchange has ended (seen by progress, on whichever thread) they run in the order they
// were made, on the vendor library or on HMC's schedule. A program may so start a
// collective and then wait for a message that its peer sends before it reaches that
// collective. Only a call on a stream, which must be queued on it before it returns,
// waits in the call for the exchange to end (up to HMC_TIMEOUT).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

#include "collectives/select.h"
#include "hmc/collectives.h"
#include "hmc/communicator.h"
#include "hmc/request.h"

namespace hmc::core {
class CommImpl;
}

namespace hmc::coll {

// One collective as the vendor library takes it, with this rank's buffers.
struct CommState;  // comm_state.h

struct CclWork {
  CollKind kind;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t send_bytes = 0;  // this rank's extents (0: unused on this rank)
  std::size_t recv_bytes = 0;
  std::size_t count = 0;       // all_gather, reduce_scatter, all_to_all: per rank
  DataType dtype = DataType::kUint8;
  std::optional<ReduceOp> op = std::nullopt;
  int root = 0;
  std::size_t result_bytes = 0;  // what Request::bytes reports
};

// Whether kind can be delegated at all.
bool ccl_kind(CollKind kind);

// A call on HMC's own schedule, run later.
using OwnCall = std::function<Request()>;

// The request of `w` run by the communicator's vendor library (`st`: its CommState), or
// nullopt when this call is not delegated (then HMC's schedule runs it, on every rank
// alike). While delegation is being decided, the request of a call that waits for the
// decision: `later()` gives what runs it on HMC's schedule if it is not delegated. A
// collective of `kind` with no `w` (not delegable) waits too, so that it does not overtake
// the calls that wait (collectives over shared segments take their numbers as they start).
std::optional<Request> try_delegate(core::CommImpl& ci, CommState& st, CollKind kind, const CclWork* w,
                                    const CollOptions& opt, const std::function<OwnCall()>& later);

// The communicator is aborted: its vendor link, if made, fails what waits in it and ends
// what runs on it (calls it would still hand to HMC's schedule fail instead).
void abort_delegation(CommState& st);

}  // namespace hmc::coll
