// Ring algorithms: bandwidth-optimal for large messages, any rank count.
//
// Every rank sends to its right neighbour and receives from its left one; each block is
// cut into chunks, and a chunk moves on as soon as it arrived (and was reduced), so the
// ring runs as a pipeline. Received chunks land in the user's buffer wherever that holds
// nothing yet, else in a few scratch slots reused round-robin.
#include "collectives/algorithms.h"

namespace hmc::coll {
namespace {

constexpr std::size_t kSlots = 4;  // scratch chunks per ring: enough to keep two in flight both ways

}  // namespace

// Reduce-scatter around the ring, then all-gather of the reduced blocks. Step s of the
// first phase sends block r-s and receives block r-s-1 (reducing it into the recv
// buffer); after n-1 steps rank r holds block r+1 fully reduced and the second phase
// passes the finished blocks on. Out of place, every block is received into its final
// place (the recv buffer holds nothing before), so no scratch is needed.
Status all_reduce_ring(Plan& p, const void* send, void* recv, std::size_t count) {
  const int n = p.size, r = p.rank, right = mod(r + 1, n), left = mod(r - 1, n);
  const bool in_place = send == recv;
  auto blk = [&](int i) { return part(count, n, mod(i, n)); };
  Schedule& s = p.s;
  SlotRing slots;
  if (in_place) {
    // Blocks are q+1 or q elements long and cut into chunks separately: the longer block
    // can have one chunk more and so shorter ones (q+1 = 1025, q = 1024 with chunks of 1024:
    // 513 against 1024). A slot holds the longest first chunk of either length (q may be 0).
    auto first_chunk = [&](std::size_t len) { return len ? p.chunk_of(len, 0).len : 0; };
    std::size_t slot_elems = std::max(first_chunk(blk(0).len), first_chunk(blk(n - 1).len)), total = 0;
    for (int st = 0; st < n - 1; ++st) total += p.chunks(blk(r - st - 1).len);
    std::size_t nslots = std::max<std::size_t>(1, std::min(total, kSlots));
    auto base = p.scratch_elems(slot_elems * nslots);
    if (!base) return base.status();
    slots = SlotRing(base.value(), p.bytes(slot_elems), nslots);
  }
  std::vector<std::vector<ActionId>> rs_send(n - 1), rs_red(n - 1);
  std::size_t use = 0;
  for (int st = 0; st < n - 1; ++st) {
    Range sb = blk(r - st), rb = blk(r - st - 1);
    rs_red[st].resize(p.chunks(rb.len));
    for (std::size_t c = 0; c < rs_red[st].size(); ++c) {
      Range ch = p.chunk_of(rb.len, c);
      uint8_t* dst = p.at(recv, rb.off + ch.off);
      if (!in_place) {
        ActionId got = s.recv(dst, p.bytes(ch.len), left, subtag(st, c));
        rs_red[st][c] = s.reduce(dst, dst, p.at(send, rb.off + ch.off), ch.len, {got});
      } else {
        uint8_t* slot = slots.slot(use);
        ActionId got = s.recv(slot, p.bytes(ch.len), left, subtag(st, c));
        slots.acquire(s, use, got);
        rs_red[st][c] = s.reduce(dst, dst, slot, ch.len, {got});
        slots.release(s, use++, rs_red[st][c]);
      }
    }
    rs_send[st].resize(p.chunks(sb.len));
    for (std::size_t c = 0; c < rs_send[st].size(); ++c) {
      Range ch = p.chunk_of(sb.len, c);
      const void* src = p.at(st == 0 ? send : recv, sb.off + ch.off);
      rs_send[st][c] = s.send(src, p.bytes(ch.len), right, subtag(st, c), {st == 0 ? kNoAction : rs_red[st - 1][c]});
    }
  }
  // Rank r now owns block r+1: finish avg there, once, so every rank gets the same values.
  Range own = blk(r + 1);
  std::vector<ActionId> fin = rs_red[n - 2];
  if (p.avg)
    for (std::size_t c = 0; c < fin.size(); ++c) {
      Range ch = p.chunk_of(own.len, c);
      fin[c] = s.divide(p.at(recv, own.off + ch.off), ch.len, {fin[c]});
    }
  std::vector<std::vector<ActionId>> ag_recv(n - 1);
  for (int st = 0; st < n - 1; ++st) {
    const uint64_t step = n - 1 + st;
    Range sb = blk(r + 1 - st), rb = blk(r - st);
    ag_recv[st].resize(p.chunks(rb.len));
    for (std::size_t c = 0; c < ag_recv[st].size(); ++c) {
      Range ch = p.chunk_of(rb.len, c);
      // Block r-st was sent in step st of the first phase: overwrite it only after that.
      ActionId sent = in_place || st > 0 ? rs_send[st][c] : kNoAction;
      ag_recv[st][c] = s.recv(p.at(recv, rb.off + ch.off), p.bytes(ch.len), left, subtag(step, c), {sent});
    }
    for (std::size_t c = 0; c < p.chunks(sb.len); ++c) {
      Range ch = p.chunk_of(sb.len, c);
      s.send(p.at(recv, sb.off + ch.off), p.bytes(ch.len), right, subtag(step, c), {st == 0 ? fin[c] : ag_recv[st - 1][c]});
    }
  }
  return {};
}

// Step s sends block r-s and receives block r-s-1, straight into its place.
Status all_gather_ring(Plan& p, const void* send, void* recv, std::size_t count) {
  const int n = p.size, r = p.rank, right = mod(r + 1, n), left = mod(r - 1, n);
  Schedule& s = p.s;
  s.copy(p.at(recv, r * count), send, p.bytes(count));
  const std::size_t chunks = p.chunks(count);
  std::vector<ActionId> prev(chunks, kNoAction), got(chunks);
  for (int st = 0; st < n - 1; ++st) {
    std::size_t rb = mod(r - st - 1, n), sb = mod(r - st, n);
    for (std::size_t c = 0; c < chunks; ++c) {
      Range ch = p.chunk_of(count, c);
      got[c] = s.recv(p.at(recv, rb * count + ch.off), p.bytes(ch.len), left, subtag(st, c));
      // Step 0 sends from the user's send buffer: no need to wait for the local copy.
      const void* src = st == 0 ? p.at(send, ch.off) : p.at(recv, sb * count + ch.off);
      s.send(src, p.bytes(ch.len), right, subtag(st, c), {prev[c]});
    }
    prev = got;
  }
  return {};
}

// Step s sends the partial sum of block r-s-1 and receives that of block r-s-2, adds
// this rank's contribution and passes it on; the last step ends with block r. Partial
// sums live in scratch slots (the send buffer is never written). A slot is free again
// once the send that forwards its partial completed, and a rendezvous send completes only
// after the right neighbour posted its receive: slots are therefore used chunk-major
// (chunk c through every step, then chunk c+1), so a receive never waits for a send of
// its own step and chunk, which would wait for the neighbour's same receive, around the
// ring (a deadlock with one slot per chunk of a step).
Status reduce_scatter_ring(Plan& p, const void* send, void* recv, std::size_t count) {
  const int n = p.size, r = p.rank, right = mod(r + 1, n), left = mod(r - 1, n);
  Schedule& s = p.s;
  const std::size_t chunks = p.chunks(count), total = (n - 1) * chunks;
  const std::size_t nslots = std::min(total, std::max<std::size_t>(kSlots, 2));
  auto base = p.scratch_elems(p.chunk_of(count, 0).len * nslots);
  if (!base) return base.status();
  SlotRing slots(base.value(), p.bytes(p.chunk_of(count, 0).len), nslots);
  std::vector<ActionId> prev_red(chunks, kNoAction), red(chunks);
  for (int st = 0; st < n - 1; ++st) {
    const std::size_t sb = mod(r - st - 1, n), rb = mod(r - st - 2, n);
    for (std::size_t c = 0; c < chunks; ++c) {
      Range ch = p.chunk_of(count, c);
      // The partial of block sb arrived in step st-1.
      if (st == 0) {
        s.send(p.at(send, sb * count + ch.off), p.bytes(ch.len), right, subtag(st, c));
      } else {
        std::size_t u = c * (n - 1) + st - 1;
        ActionId sent = s.send(slots.slot(u), p.bytes(ch.len), right, subtag(st, c), {prev_red[c]});
        slots.release(s, u, sent);
      }
      std::size_t u = c * (n - 1) + st;
      uint8_t* slot = slots.slot(u);
      ActionId got = s.recv(slot, p.bytes(ch.len), left, subtag(st, c));
      slots.acquire(s, u, got);
      if (st < n - 2) {
        red[c] = s.reduce(slot, slot, p.at(send, rb * count + ch.off), ch.len, {got});
      } else {
        uint8_t* out = p.at(recv, ch.off);
        red[c] = s.reduce(out, slot, p.at(send, r * count + ch.off), ch.len, {got});
        slots.release(s, u, red[c]);
        if (p.avg) s.divide(out, ch.len, {red[c]});
      }
    }
    prev_red = red;
  }
  return {};
}

}  // namespace hmc::coll
