// Schedule: a collective as a small graph of actions (send, recv, reduce, copy, divide),
// each waiting for the actions it depends on.
//
// Algorithms are written as builders that fill a Schedule; one executor (CollOp) runs every
// schedule. Dependencies carry both the data flow (a send waits for the reduction that
// produced its data) and buffer reuse (a receive into a scratch slot waits until the
// previous contents were consumed; a receive into a region waits until the send that read
// it is done, since a rendezvous send reads its buffer long after it was posted).
// Receives with nothing to wait for are posted at once, so data that arrives early lands
// in place instead of in the unexpected queue, and a chunk's receive is posted before the
// previous chunk is reduced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace hmc::coll {

using ActionId = int32_t;
inline constexpr ActionId kNoAction = -1;

enum class ActKind : uint8_t { kSend, kRecv, kReduce, kCopy, kDivide, kJoin, kVerify };

struct Action {
  ActKind kind;
  int32_t peer = -1;       // send/recv
  uint64_t subtag = 0;     // send/recv: low bits of the tag (see tags.h)
  void* dst = nullptr;     // recv, reduce, copy, divide
  const void* a = nullptr; // send source, reduce operand, copy source
  const void* b = nullptr; // reduce operand
  std::size_t n = 0;       // bytes for send/recv/copy, elements for reduce/divide
};

// A list of dependencies; kNoAction entries are ignored, which lets builders pass
// "the previous step's action" without special-casing the first step. Only a parameter:
// it views its argument, which lives until the end of the call's full expression.
class Deps {
 public:
  Deps() = default;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  Deps(std::initializer_list<ActionId> l) : p_(l.begin()), n_(l.size()) {}  // NOLINT(google-explicit-constructor)
#pragma GCC diagnostic pop
  Deps(const std::vector<ActionId>& v) : p_(v.data()), n_(v.size()) {}     // NOLINT(google-explicit-constructor)
  const ActionId* begin() const { return p_; }
  const ActionId* end() const { return p_ + n_; }

 private:
  const ActionId* p_ = nullptr;
  std::size_t n_ = 0;
};

class Schedule {
 public:
  Schedule();
  ~Schedule();
  Schedule(Schedule&&) = default;
  Schedule& operator=(Schedule&&) = default;

  ActionId send(const void* buf, std::size_t bytes, int peer, uint64_t subtag, Deps deps = {});
  ActionId recv(void* buf, std::size_t bytes, int peer, uint64_t subtag, Deps deps = {});
  ActionId reduce(void* dst, const void* a, const void* b, std::size_t count, Deps deps = {});
  ActionId copy(void* dst, const void* src, std::size_t bytes, Deps deps = {});
  ActionId divide(void* buf, std::size_t count, Deps deps = {});
  // Completes when its dependencies have; lets a later action wait for a whole step.
  ActionId join(Deps deps);
  // Adds a dependency after both actions exist (for buffer reuse found later).
  void depend(ActionId action, ActionId on);
  // Makes every action that waits for nothing wait for `gate` (which must be a new action).
  void gate_roots(ActionId gate);
  // Moves every pointer in [from, from + bytes] to the same offset from `to` (the end
  // too: an empty action may point there).
  void rebase(const void* from, std::size_t bytes, void* to);

  std::size_t size() const { return actions_.size(); }
  const Action& at(ActionId id) const { return actions_[id]; }
  const std::vector<std::pair<ActionId, ActionId>>& edges() const { return edges_; }  // (on, action)

 private:
  ActionId add(Action a, Deps deps);
  std::vector<Action> actions_;
  std::vector<std::pair<ActionId, ActionId>> edges_;
};

// Scratch slots used round-robin: use k of the ring takes slot k % slots and waits until
// use k - slots released it. Acquire and release may be declared in any order.
class SlotRing {
 public:
  SlotRing() = default;
  SlotRing(uint8_t* base, std::size_t slot_bytes, std::size_t slots);
  ~SlotRing();
  SlotRing(SlotRing&&) = default;
  SlotRing& operator=(SlotRing&&) = default;
  uint8_t* slot(std::size_t k) const { return base_ + (k % slots_) * slot_bytes_; }
  // `first` is the first action of use k (it must wait for the slot).
  void acquire(Schedule& s, std::size_t k, ActionId first);
  // `last` is the final action of use k that touches the slot.
  void release(Schedule& s, std::size_t k, ActionId last);

 private:
  static void put(std::vector<ActionId>& v, std::size_t i, ActionId id);
  static ActionId get(const std::vector<ActionId>& v, std::size_t i);
  uint8_t* base_ = nullptr;
  std::size_t slot_bytes_ = 0;
  std::size_t slots_ = 1;
  std::vector<std::vector<ActionId>> first_, last_;  // per slot, per round
};

}  // namespace hmc::coll
