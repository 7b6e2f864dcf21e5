#include "collectives/driver.h"

#include <algorithm>

namespace hmc::coll {

Driver& Driver::of(const std::shared_ptr<core::ProgressEngine>& engine) {
  using Entry = std::pair<std::weak_ptr<core::ProgressEngine>, std::unique_ptr<Driver>>;
  static std::mutex mu;
  static auto* drivers = new std::vector<Entry>();  // never destroyed: engines may outlive static destructors
  std::lock_guard lock(mu);
  for (auto it = drivers->begin(); it != drivers->end();) {
    // An expired engine calls nobody any more; its driver has no collectives left either,
    // since each collective's Operation keeps the engine alive.
    if (it->first.expired()) {
      it = drivers->erase(it);
      continue;
    }
    if (!it->first.owner_before(engine) && !engine.owner_before(it->first)) return *it->second;
    ++it;
  }
  drivers->emplace_back(engine, std::unique_ptr<Driver>(new Driver(engine.get())));
  return *drivers->back().second;
}

void Driver::launch(std::unique_ptr<DriverOp> op, std::shared_ptr<core::StreamOrder> order) {
  std::lock_guard lock(mu_);
  const bool start = !order || order->ready();
  if (start) op->start();
  if (op->finished()) {
    if (order) order->finish();
    return;
  }
  ops_.push_back({std::move(op), std::move(order), start});
  if (!registered_) {
    engine_->add(this);
    registered_ = true;
  }
}

void Driver::drop(const std::shared_ptr<core::ProgressEngine>& engine, const void* comm, const Status& why) {
  Driver& d = of(engine);
  std::lock_guard lock(d.mu_);
  for (std::size_t i = 0; i < d.ops_.size();) {
    Entry& e = d.ops_[i];
    if (!e.op->uses(comm)) {
      ++i;
      continue;
    }
    e.op->drop(why);
    if (e.order) e.order->finish();
    d.ops_.erase(d.ops_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  // Left registered while empty: the next pass takes it off the engine's list (remove()
  // must not run under mu_, which a pass in flight may be waiting for).
}

bool Driver::progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool any = false;
  if (engine_->closed()) {
    for (auto& e : ops_) {
      e.op->abandon({ErrorCode::kFinalized, "the context was destroyed while the collective was pending"});
      if (e.order) e.order->finish();
    }
    any = !ops_.empty();
    ops_.clear();
  }
  // Finished ones leave in one sweep that keeps the order: erasing each where it stood
  // moved the rest every time (70,000 small collectives in flight took 85 s).
  // Lines whose first op waits (DriverOp::line): the rest of them are not run this pass.
  std::vector<const void*>& held = held_lines_;
  held.clear();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    Entry& e = ops_[i];
    const void* line = e.op->line();
    const bool behind = line && std::find(held.begin(), held.end(), line) != held.end();
    if (!behind && !e.started && e.order->ready()) {
      e.op->start();
      e.started = any = true;
    }
    if (!behind && e.started) any |= e.op->advance();
    if (!behind && line && e.op->waiting_in_line()) held.push_back(line);
    if (e.op->finished()) {
      if (e.order) e.order->finish();
    } else {
      if (kept != i) ops_[kept] = std::move(e);
      ++kept;
    }
  }
  ops_.resize(kept);
  if (ops_.empty() && registered_) {
    engine_->remove(this);
    registered_ = false;
  }
  return any;
}

}  // namespace hmc::coll
