// Recursive doubling and halving: log2(n) steps, for small and medium messages.
//
// A non-power-of-two rank count is folded: with p the largest power of two <= n, the
// first 2(n-p) ranks pair up, the even one of each pair hands its vector to the odd one
// and sits out, the p remaining ranks run the algorithm, and the odd ranks hand the
// result back. (all_gather and reduce_scatter have no fold: api.cpp runs ring instead.)
// Partners reduce with the lower rank's data as the first operand, so both compute the
// same bits even where an op is not bitwise commutative (min/max of -0.0 and +0.0).
#include "collectives/algorithms.h"

namespace hmc::coll {
namespace {

struct Fold {
  int p = 1;     // ranks taking part
  int rem = 0;   // n - p
  int v = -1;    // this rank's index among the p; -1 when it sits out
  bool odd = false;  // receives an extra rank's vector first
  int real(int vr) const { return vr < rem ? 2 * vr + 1 : vr + rem; }
};

Fold fold(int r, int n) {
  Fold f;
  while (f.p * 2 <= n) f.p *= 2;
  f.rem = n - f.p;
  if (r < 2 * f.rem) {
    f.odd = r % 2 == 1;
    f.v = f.odd ? r / 2 : -1;
  } else {
    f.v = r - f.rem;
  }
  return f;
}

int log2i(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

// dst = lower-rank operand op higher-rank operand.
ActionId reduce_ordered(Schedule& s, bool mine_first, void* dst, const void* mine, const void* theirs,
                        std::size_t count, Deps deps) {
  return mine_first ? s.reduce(dst, mine, theirs, count, deps) : s.reduce(dst, theirs, mine, count, deps);
}

// The elements of blocks [lo, hi) of `count` cut into p blocks.
Range blocks(std::size_t count, int p, int lo, int hi) {
  std::size_t begin = part(count, p, lo).off;
  std::size_t end = hi == p ? count : part(count, p, hi).off;
  return {begin, end - begin};
}

// An extra rank of the fold: hands its vector over and receives the result.
void sit_out(Plan& p, const void* send, void* recv, std::size_t count, uint64_t final_step) {
  ActionId sent = p.s.send(send, p.bytes(count), p.rank + 1, subtag(0));
  p.s.recv(recv, p.bytes(count), p.rank + 1, subtag(final_step), {send == recv ? sent : kNoAction});
}

}  // namespace

// Every step exchanges the whole vector with the partner at distance 1, 2, 4, ...
Status all_reduce_rd(Plan& p, const void* send, void* recv, std::size_t count) {
  const int r = p.rank;
  Schedule& s = p.s;
  const Fold f = fold(r, p.size);
  const int steps = log2i(f.p);
  const uint64_t final_step = steps + 1;
  const std::size_t bytes = p.bytes(count);
  if (f.v < 0) {
    sit_out(p, send, recv, count, final_step);
    return {};
  }
  auto base = p.scratch_elems(count, 2);
  if (!base) return base.status();
  SlotRing slots(base.value(), bytes, 2);  // two, so the next receive is posted before this reduce
  std::size_t use = 0;
  const void* cur = send;
  ActionId last = kNoAction;
  if (f.odd) {
    uint8_t* in = slots.slot(use);
    ActionId got = s.recv(in, bytes, r - 1, subtag(0));
    slots.acquire(s, use, got);
    last = s.reduce(recv, in, send, count, {got});
    slots.release(s, use++, last);
    cur = recv;
  }
  for (int k = 0, mask = 1; mask < f.p; ++k, mask <<= 1) {
    const int peer = f.real(f.v ^ mask);
    uint8_t* in = slots.slot(use);
    ActionId got = s.recv(in, bytes, peer, subtag(k + 1));
    slots.acquire(s, use, got);
    ActionId sent = s.send(cur, bytes, peer, subtag(k + 1), {last});
    // The reduction overwrites recv: when the send reads recv, it must be done first.
    last = reduce_ordered(s, r < peer, recv, cur, in, count, {got, last, cur == recv ? sent : kNoAction});
    slots.release(s, use++, last);
    cur = recv;
  }
  if (p.avg) last = s.divide(recv, count, {last});
  if (f.odd) s.send(recv, bytes, r - 1, subtag(final_step), {last});
  return {};
}

// Rabenseifner: recursive halving reduce-scatter (each step exchanges half of the current
// range and keeps the other half), then recursive doubling all-gather of the finished
// blocks. Same bandwidth as ring with log2(p) steps instead of n-1.
Status all_reduce_rhd(Plan& p, const void* send, void* recv, std::size_t count) {
  const int r = p.rank;
  Schedule& s = p.s;
  const Fold f = fold(r, p.size);
  const int steps = log2i(f.p);
  const uint64_t final_step = 2 * steps + 1;
  if (f.v < 0) {
    sit_out(p, send, recv, count, final_step);
    return {};
  }
  // Receive areas: the folded vector, then one distinct area per halving step (nested
  // halves: p - 1 blocks in all, at most count + p elements), so every receive can be
  // posted at once.
  auto base = p.scratch_elems(count, f.odd ? 2 : 1, f.p);
  if (!base) return base.status();
  uint8_t* area = base.value();
  const void* cur = send;
  ActionId prev = kNoAction;
  if (f.odd) {
    ActionId got = s.recv(area, p.bytes(count), r - 1, subtag(0));
    prev = s.reduce(recv, area, send, count, {got});
    area += p.bytes(count);
    cur = recv;
  }
  int lo = 0, hi = f.p;
  std::vector<int> partner(steps);
  std::vector<Range> given(steps);
  std::vector<std::vector<ActionId>> sent(steps);
  for (int k = 0; k < steps; ++k) {
    const int d = f.p >> (k + 1), mid = lo + d;
    const bool upper = (f.v & d) != 0;
    const int peer = f.real(f.v ^ d);
    Range keep = upper ? blocks(count, f.p, mid, hi) : blocks(count, f.p, lo, mid);
    Range give = upper ? blocks(count, f.p, lo, mid) : blocks(count, f.p, mid, hi);
    std::vector<ActionId> step_done{prev};
    for (std::size_t c = 0; c < p.chunks(keep.len); ++c) {
      Range ch = p.chunk_of(keep.len, c);
      uint8_t* in = area + p.bytes(ch.off);
      ActionId got = s.recv(in, p.bytes(ch.len), peer, subtag(1 + k, c));
      step_done.push_back(reduce_ordered(s, r < peer, p.at(recv, keep.off + ch.off), p.at(cur, keep.off + ch.off), in,
                                         ch.len, {got, prev}));
    }
    for (std::size_t c = 0; c < p.chunks(give.len); ++c) {
      Range ch = p.chunk_of(give.len, c);
      sent[k].push_back(s.send(p.at(cur, give.off + ch.off), p.bytes(ch.len), peer, subtag(1 + k, c), {prev}));
    }
    area += p.bytes(keep.len);
    partner[k] = peer;
    given[k] = give;
    prev = s.join(step_done);
    cur = recv;
    if (upper) lo = mid;
    else hi = mid;
  }
  if (p.avg) {
    Range mine = blocks(count, f.p, lo, hi);
    std::vector<ActionId> divided{prev};
    for (std::size_t c = 0; c < p.chunks(mine.len); ++c) {
      Range ch = p.chunk_of(mine.len, c);
      divided.push_back(s.divide(p.at(recv, mine.off + ch.off), ch.len, {prev}));
    }
    prev = s.join(divided);
  }
  // All-gather in reverse order: send what this rank holds, receive what it gave away.
  for (int j = 0; j < steps; ++j) {
    const int k = steps - 1 - j;
    Range give = given[k];
    Range have = blocks(count, f.p, lo, hi);
    std::vector<ActionId> step_done{prev};
    for (std::size_t c = 0; c < p.chunks(give.len); ++c) {
      Range ch = p.chunk_of(give.len, c);
      // The region went out in halving step k; overwrite it only after that send.
      step_done.push_back(s.recv(p.at(recv, give.off + ch.off), p.bytes(ch.len), partner[k],
                                 subtag(1 + steps + j, c), {sent[k][c]}));
    }
    for (std::size_t c = 0; c < p.chunks(have.len); ++c) {
      Range ch = p.chunk_of(have.len, c);
      s.send(p.at(recv, have.off + ch.off), p.bytes(ch.len), partner[k], subtag(1 + steps + j, c), {prev});
    }
    prev = s.join(step_done);
    // The range held doubles: this rank's and the partner's halves.
    const int width = hi - lo;
    if ((f.v & width) != 0) lo -= width;
    else hi += width;
  }
  if (f.odd) s.send(recv, p.bytes(count), r - 1, subtag(final_step), {prev});
  return {};
}

// Step k exchanges the 2^k blocks gathered so far with the partner at distance 2^k;
// received blocks land in place.
Status all_gather_rd(Plan& p, const void* send, void* recv, std::size_t count) {
  const int r = p.rank;
  Schedule& s = p.s;
  ActionId prev = s.copy(p.at(recv, r * count), send, p.bytes(count));
  for (int k = 0; (1 << k) < p.size; ++k) {
    const int d = 1 << k, peer = r ^ d;
    const std::size_t mine = static_cast<std::size_t>((r >> k) << k) * count;
    const std::size_t theirs = static_cast<std::size_t>((peer >> k) << k) * count;
    const std::size_t len = d * count;
    std::vector<ActionId> step_done{prev};
    for (std::size_t c = 0; c < p.chunks(len); ++c) {
      Range ch = p.chunk_of(len, c);
      step_done.push_back(s.recv(p.at(recv, theirs + ch.off), p.bytes(ch.len), peer, subtag(k, c)));
      // Step 0 sends the user's block itself, without waiting for the local copy.
      const void* src = k == 0 ? p.at(send, ch.off) : p.at(recv, mine + ch.off);
      s.send(src, p.bytes(ch.len), peer, subtag(k, c), {k == 0 ? kNoAction : prev});
    }
    prev = s.join(step_done);
  }
  return {};
}

// Recursive halving: each step sends the half of the current range that the partner
// keeps and adds the partner's contribution to the half this rank keeps; the last step
// leaves block r, reduced into recv. Partial sums live in scratch (send is only read).
Status reduce_scatter_rh(Plan& p, const void* send, void* recv, std::size_t count) {
  const int r = p.rank, n = p.size;
  Schedule& s = p.s;
  const int steps = log2i(n);
  const std::size_t total = count * n;
  // acc holds the kept half after step 0 (indexed from its start); the receive areas of
  // the steps follow it.
  auto base = p.scratch_elems(total / 2, 1, total);
  if (!base) return base.status();
  uint8_t* acc = base.value();
  uint8_t* area = acc + p.bytes(total / 2);
  std::size_t acc_origin = 0;
  auto src_at = [&](int k, std::size_t off) -> const uint8_t* {
    return k == 0 ? p.at(send, off) : acc + p.bytes(off - acc_origin);
  };
  int lo = 0;
  ActionId prev = kNoAction;
  for (int k = 0; k < steps; ++k) {
    const int d = n >> (k + 1), mid = lo + d, peer = r ^ d;
    const bool upper = (r & d) != 0, last = k == steps - 1;
    Range keep{static_cast<std::size_t>(upper ? mid : lo) * count, static_cast<std::size_t>(d) * count};
    Range give{static_cast<std::size_t>(upper ? lo : mid) * count, static_cast<std::size_t>(d) * count};
    if (k == 0) acc_origin = keep.off;
    std::vector<ActionId> step_done{prev};
    for (std::size_t c = 0; c < p.chunks(keep.len); ++c) {
      Range ch = p.chunk_of(keep.len, c);
      uint8_t* in = area + p.bytes(ch.off);
      ActionId got = s.recv(in, p.bytes(ch.len), peer, subtag(k, c));
      uint8_t* dst = last ? p.at(recv, ch.off) : acc + p.bytes(keep.off + ch.off - acc_origin);
      step_done.push_back(reduce_ordered(s, r < peer, dst, src_at(k, keep.off + ch.off), in, ch.len, {got, prev}));
    }
    for (std::size_t c = 0; c < p.chunks(give.len); ++c) {
      Range ch = p.chunk_of(give.len, c);
      s.send(src_at(k, give.off + ch.off), p.bytes(ch.len), peer, subtag(k, c), {prev});
    }
    area += p.bytes(keep.len);
    prev = s.join(step_done);
    if (upper) lo = mid;
  }
  if (p.avg)
    for (std::size_t c = 0; c < p.chunks(count); ++c) {
      Range ch = p.chunk_of(count, c);
      s.divide(p.at(recv, ch.off), ch.len, {prev});
    }
  return {};
}

}  // namespace hmc::coll
