// Algorithm builders: each lays one collective out as actions of p.s (see schedule.h).
// Buffers are the user's; counts are in elements. Builders run with size >= 2 (api.cpp
// handles a single rank) and with matching arguments on every rank.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/plan.h"
#include "hmc/status.h"

namespace hmc::coll {

// ring.cpp
Status all_reduce_ring(Plan& p, const void* send, void* recv, std::size_t count);
Status all_gather_ring(Plan& p, const void* send, void* recv, std::size_t count);
Status reduce_scatter_ring(Plan& p, const void* send, void* recv, std::size_t count);

// recursive.cpp (non-power-of-two all_reduce folds the extra ranks in and out)
Status all_reduce_rd(Plan& p, const void* send, void* recv, std::size_t count);
Status all_reduce_rhd(Plan& p, const void* send, void* recv, std::size_t count);
// Power-of-two rank counts only (api.cpp falls back to ring otherwise).
Status all_gather_rd(Plan& p, const void* send, void* recv, std::size_t count);
Status reduce_scatter_rh(Plan& p, const void* send, void* recv, std::size_t count);

// tree.cpp: binomial tree, or a pipelined chain (root -> root+1 -> ...) when `chain`.
// Everything waits for `after`; the result is an action that completes when this rank's
// part is done. `step` keeps the tags apart when two trees share one collective.
Result<ActionId> broadcast_tree(Plan& p, void* buf, std::size_t count, int root, bool chain, ActionId after,
                                uint64_t step);
Result<ActionId> reduce_tree(Plan& p, const void* send, void* recv, std::size_t count, int root, bool chain,
                             ActionId after, uint64_t step);

// exchange.cpp. all_to_all with per-peer counts and displacements (elements); `window`
// is how many peer steps may be in flight at once (1: pairwise, size - 1: all at once).
Status all_to_all_v(Plan& p, const void* send, const std::vector<std::size_t>& send_counts,
                    const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
                    const std::vector<std::size_t>& recv_displs, int window);
// all_to_all with send == recv: saves only the blocks still to be sent when they arrive.
Status all_to_all_in_place(Plan& p, void* buf, std::size_t count, int window);
Status gather_linear(Plan& p, const void* send, void* recv, std::size_t count, int root);
Status scatter_linear(Plan& p, const void* send, void* recv, std::size_t count, int root);
Status barrier_dissemination(Plan& p);

}  // namespace hmc::coll
