// Personalised exchanges: all_to_all(_v), gather, scatter, and the barrier.
#include "collectives/algorithms.h"

namespace hmc::coll {

// Step s sends to rank r+s and receives from rank r-s. At most `window` steps are in
// flight: one at a time (pairwise) keeps every link busy with one message each way for
// large blocks; all at once suits small ones, where latency dominates.
Status all_to_all_v(Plan& p, const void* send, const std::vector<std::size_t>& send_counts,
                    const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
                    const std::vector<std::size_t>& recv_displs, int window) {
  const int n = p.size, r = p.rank;
  Schedule& s = p.s;
  const void* src = send;
  ActionId ready = kNoAction;
  if (send == recv) {
    // In place: receives overwrite blocks still to be sent, so send from a copy of the
    // blocks that are sent (an empty block's displacement may point anywhere).
    std::size_t extent = 0;
    for (int j = 0; j < n; ++j)
      if (send_counts[j]) extent = std::max(extent, send_displs[j] + send_counts[j]);
    auto copy = p.scratch_elems(extent);
    if (!copy) return copy.status();
    ready = s.copy(copy.value(), send, p.bytes(extent));
    src = copy.value();
  }
  s.copy(p.at(recv, recv_displs[r]), p.at(src, send_displs[r]), p.bytes(send_counts[r]), {ready});
  std::vector<ActionId> step_done(n, kNoAction);
  for (int st = 1; st < n; ++st) {
    const int to = mod(r + st, n), from = mod(r - st, n);
    const ActionId gate = st > window ? step_done[st - window] : kNoAction;
    std::vector<ActionId> ops;
    if (recv_counts[from] > 0)
      ops.push_back(s.recv(p.at(recv, recv_displs[from]), p.bytes(recv_counts[from]), from, subtag(st), {ready, gate}));
    if (send_counts[to] > 0)
      ops.push_back(s.send(p.at(src, send_displs[to]), p.bytes(send_counts[to]), to, subtag(st), {ready, gate}));
    step_done[st] = s.join(ops);
  }
  return {};
}

Status all_to_all_in_place(Plan& p, void* buf, std::size_t count, int window) {
  const int n = p.size, r = p.rank;
  Schedule& s = p.s;
  // Block f = r - st is received in step st and sent in step n - st. When that send comes
  // later (or in the same step), the block is saved first and sent from the copy; when it
  // came earlier, the receive waits for it. floor(n/2) blocks are saved, instead of a copy
  // of the whole buffer.
  auto saved = p.scratch_elems(count, n / 2);
  if (!saved) return saved.status();
  std::vector<ActionId> copied(n, kNoAction), sent(n, kNoAction), step_done(n, kNoAction);
  std::vector<const void*> source(n, nullptr);
  for (int st = 1; 2 * st <= n; ++st) {
    const int f = mod(r - st, n);
    source[n - st] = saved.value() + p.bytes((st - 1) * count);
    copied[n - st] = s.copy(const_cast<void*>(source[n - st]), p.at(buf, f * count), p.bytes(count));
  }
  for (int st = 1; st < n; ++st) {
    const int to = mod(r + st, n), from = mod(r - st, n);
    const ActionId gate = st > window ? step_done[st - window] : kNoAction;
    const void* src = source[st] ? source[st] : p.at(buf, to * count);
    sent[st] = s.send(src, p.bytes(count), to, subtag(st), {gate, copied[st]});
    // The block arriving now leaves in step n - st: after its copy, or after that send.
    const ActionId free = 2 * st <= n ? copied[n - st] : sent[n - st];
    ActionId got = s.recv(p.at(buf, from * count), p.bytes(count), from, subtag(st), {gate, free});
    step_done[st] = s.join({sent[st], got});
  }
  return {};
}

// The root posts one receive per rank, straight into place; they all run at once.
Status gather_linear(Plan& p, const void* send, void* recv, std::size_t count, int root) {
  Schedule& s = p.s;
  if (p.rank != root) {
    s.send(send, p.bytes(count), root, subtag(0));
    return {};
  }
  for (int j = 0; j < p.size; ++j)
    if (j != root) s.recv(p.at(recv, j * count), p.bytes(count), j, subtag(0));
  s.copy(p.at(recv, root * count), send, p.bytes(count));
  return {};
}

Status scatter_linear(Plan& p, const void* send, void* recv, std::size_t count, int root) {
  Schedule& s = p.s;
  if (p.rank != root) {
    s.recv(recv, p.bytes(count), root, subtag(0));
    return {};
  }
  for (int j = 0; j < p.size; ++j)
    if (j != root) s.send(p.at(send, j * count), p.bytes(count), j, subtag(0));
  s.copy(recv, p.at(send, root * count), p.bytes(count));
  return {};
}

// Dissemination: in round k every rank signals rank r + 2^k once it heard from rank
// r - 2^(k-1); after ceil(log2 n) rounds everyone has heard, indirectly, from everyone.
Status barrier_dissemination(Plan& p) {
  static uint8_t token = 0;  // zero-byte messages still need an address
  Schedule& s = p.s;
  const int n = p.size, r = p.rank;
  ActionId heard = kNoAction;
  for (int k = 0, d = 1; d < n; ++k, d <<= 1) {
    ActionId got = s.recv(&token, 0, mod(r - d, n), subtag(k));
    s.send(&token, 0, mod(r + d, n), subtag(k), {heard});
    heard = s.join({got, heard});
  }
  return {};
}

}  // namespace hmc::coll
