#include "collectives/schedule.h"

#include <cstdint>

#include "collectives/reuse.h"

namespace hmc::coll {

Schedule::Schedule() { take_all(actions_, edges_); }
Schedule::~Schedule() { give_all(actions_, edges_); }

ActionId Schedule::add(Action a, Deps deps) {
  auto id = static_cast<ActionId>(actions_.size());
  actions_.push_back(a);
  for (ActionId d : deps)
    if (d != kNoAction) edges_.emplace_back(d, id);
  return id;
}

ActionId Schedule::send(const void* buf, std::size_t bytes, int peer, uint64_t subtag, Deps deps) {
  return add({ActKind::kSend, peer, subtag, nullptr, buf, nullptr, bytes}, deps);
}

ActionId Schedule::recv(void* buf, std::size_t bytes, int peer, uint64_t subtag, Deps deps) {
  return add({ActKind::kRecv, peer, subtag, buf, nullptr, nullptr, bytes}, deps);
}

ActionId Schedule::reduce(void* dst, const void* a, const void* b, std::size_t count, Deps deps) {
  return add({ActKind::kReduce, -1, 0, dst, a, b, count}, deps);
}

ActionId Schedule::copy(void* dst, const void* src, std::size_t bytes, Deps deps) {
  if (dst == src) return join(deps);
  return add({ActKind::kCopy, -1, 0, dst, src, nullptr, bytes}, deps);
}

ActionId Schedule::divide(void* buf, std::size_t count, Deps deps) {
  return add({ActKind::kDivide, -1, 0, buf, nullptr, nullptr, count}, deps);
}

ActionId Schedule::join(Deps deps) { return add({ActKind::kJoin}, deps); }

void Schedule::rebase(const void* from, std::size_t bytes, void* to) {
  const auto* lo = static_cast<const uint8_t*>(from);
  auto* dst = static_cast<uint8_t*>(to);
  auto move = [&](auto*& p) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (b && b >= lo && b <= lo + bytes) p = dst + (b - lo);
  };
  for (Action& a : actions_) {
    move(a.dst);
    move(a.a);
    move(a.b);
  }
}

void Schedule::depend(ActionId action, ActionId on) {
  if (action != kNoAction && on != kNoAction) edges_.emplace_back(on, action);
}

void Schedule::gate_roots(ActionId gate) {
  std::vector<bool> has_dep(actions_.size(), false);
  for (auto [on, id] : edges_) has_dep[id] = true;
  for (ActionId id = 0; id < static_cast<ActionId>(actions_.size()); ++id)
    if (id != gate && !has_dep[id]) edges_.emplace_back(gate, id);
}

SlotRing::SlotRing(uint8_t* base, std::size_t slot_bytes, std::size_t slots)
    : base_(base), slot_bytes_(slot_bytes), slots_(slots) {
  take_all(first_, last_);
  first_.resize(slots);
  last_.resize(slots);
  for (std::size_t i = 0; i < slots; ++i) take_all(first_[i], last_[i]);
}

SlotRing::~SlotRing() {
  for (std::size_t i = 0; i < first_.size(); ++i) give_all(first_[i], last_[i]);
  give_all(first_, last_);
}

void SlotRing::put(std::vector<ActionId>& v, std::size_t i, ActionId id) {
  if (v.size() <= i) v.resize(i + 1, kNoAction);
  v[i] = id;
}

ActionId SlotRing::get(const std::vector<ActionId>& v, std::size_t i) { return i < v.size() ? v[i] : kNoAction; }

void SlotRing::acquire(Schedule& s, std::size_t k, ActionId first) {
  std::size_t slot = k % slots_, round = k / slots_;
  put(first_[slot], round, first);
  if (round > 0) s.depend(first, get(last_[slot], round - 1));
}

void SlotRing::release(Schedule& s, std::size_t k, ActionId last) {
  std::size_t slot = k % slots_, round = k / slots_;
  put(last_[slot], round, last);
  s.depend(get(first_[slot], round + 1), last);
}

}  // namespace hmc::coll
