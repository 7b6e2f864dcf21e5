// Trees for broadcast and reduce: binomial (log2(n) rounds, for latency) or a chain
// root -> root+1 -> ... (one hop per rank, but every link busy at once: for bandwidth).
// Messages are cut into chunks and a chunk is forwarded as soon as it arrived (and, for
// reduce, was combined with this rank's data), so both shapes run as pipelines.
#include "collectives/algorithms.h"

namespace hmc::coll {
namespace {

constexpr std::size_t kSlots = 4;  // receive slots per child in reduce

struct Shape {
  int parent = -1;
  std::vector<int> children;  // the largest subtree first
};

Shape shape(int r, int n, int root, bool chain) {
  Shape sh;
  const int vr = mod(r - root, n);
  auto real = [&](int v) { return (v + root) % n; };
  if (chain) {
    if (vr > 0) sh.parent = real(vr - 1);
    if (vr + 1 < n) sh.children.push_back(real(vr + 1));
    return sh;
  }
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      sh.parent = real(vr - mask);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) sh.children.push_back(real(vr + mask));
  return sh;
}

}  // namespace

Result<ActionId> broadcast_tree(Plan& p, void* buf, std::size_t count, int root, bool chain, ActionId after,
                                uint64_t step) {
  Schedule& s = p.s;
  const Shape sh = shape(p.rank, p.size, root, chain);
  std::vector<ActionId> all{after};
  for (std::size_t c = 0; c < p.chunks(count); ++c) {
    Range ch = p.chunk_of(count, c);
    uint8_t* at = p.at(buf, ch.off);
    ActionId got = after;
    if (sh.parent >= 0) {
      got = s.recv(at, p.bytes(ch.len), sh.parent, subtag(step, c), {after});
      all.push_back(got);
    }
    for (int child : sh.children) all.push_back(s.send(at, p.bytes(ch.len), child, subtag(step, c), {got}));
  }
  return s.join(all);
}

// Each chunk: this rank's data, combined with each child's (the smallest subtree first:
// its data arrives first), then sent to the parent. Non-root ranks accumulate in scratch,
// the root in recv.
Result<ActionId> reduce_tree(Plan& p, const void* send, void* recv, std::size_t count, int root, bool chain,
                             ActionId after, uint64_t step) {
  Schedule& s = p.s;
  const Shape sh = shape(p.rank, p.size, root, chain);
  const bool is_root = p.rank == root;
  const std::size_t chunks = p.chunks(count);
  std::vector<ActionId> all{after};
  uint8_t* acc = static_cast<uint8_t*>(recv);
  std::vector<SlotRing> rings;
  if (!sh.children.empty()) {
    const std::size_t slot_elems = p.chunk_of(count, 0).len, nslots = std::min(chunks, kSlots);
    auto base = p.scratch_elems(slot_elems * nslots * sh.children.size(), 1, is_root ? 0 : count);
    if (!base) return base.status();
    for (std::size_t i = 0; i < sh.children.size(); ++i)
      rings.emplace_back(base.value() + p.bytes(i * slot_elems * nslots), p.bytes(slot_elems), nslots);
    if (!is_root) acc = base.value() + p.bytes(slot_elems * nslots * sh.children.size());
  }
  for (std::size_t c = 0; c < chunks; ++c) {
    Range ch = p.chunk_of(count, c);
    const void* cur = p.at(send, ch.off);
    ActionId last = after;
    for (std::size_t i = sh.children.size(); i-- > 0;) {
      uint8_t* slot = rings[i].slot(c);
      ActionId got = s.recv(slot, p.bytes(ch.len), sh.children[i], subtag(step, c), {after});
      rings[i].acquire(s, c, got);
      uint8_t* dst = p.at(acc, ch.off);
      last = s.reduce(dst, cur, slot, ch.len, {got, last});
      rings[i].release(s, c, last);
      cur = dst;
    }
    if (is_root) {
      if (sh.children.empty()) last = s.copy(p.at(recv, ch.off), cur, p.bytes(ch.len), {last});
      if (p.avg) last = s.divide(p.at(recv, ch.off), ch.len, {last});
      all.push_back(last);
    } else {
      all.push_back(s.send(cur, p.bytes(ch.len), sh.parent, subtag(step, c), {last}));
    }
  }
  return s.join(all);
}

}  // namespace hmc::coll
