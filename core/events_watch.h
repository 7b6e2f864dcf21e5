// When a communicator's progress pass must test its peers' requests (CommImpl::progress).
//
// A net provider with an `events` count (include/hmc/provider/net.h) moves it after each
// of its requests ends. While every count a communicator's peers use stands where it stood
// before the last pass that tested them all, none of their requests can have ended since,
// and a pass may skip the peers altogether: its cost then no longer grows with the number
// of peers (ucx on shared memory, an empty poll: 8 ranks 240-460 ns -> 130-230, 16 ranks
// on 32 cores 300-630 -> 125-240; docs/performance.md). Work of the core's own that no
// request end announces (a send held for credit, which the clock may release; control
// slots to post again) asks for the next scan with rescan().
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace hmc::core {

class EventsWatch {
 public:
  using Count = uint64_t (*)(void* state);
  // Even with every count standing still a pass looks now and then: a provider whose count
  // missed an end costs a late message then, not a hang.
  static constexpr unsigned kLookEvery = 64;

  // A provider the peers use; `count` null where it has none (every pass tests then). The
  // next pass tests.
  void watch(Count count, void* state) {
    sources_.push_back({count, state, 0});
    rescan_ = true;
  }
  void clear() { sources_.clear(); }
  void rescan() { rescan_ = true; }

  // Whether this pass tests the requests; reads every count, and remembers what it read.
  bool due() {
    bool due = std::exchange(rescan_, false) || ++passes_unscanned_ >= kLookEvery;
    for (Source& s : sources_) {
      if (!s.count) {
        due = true;
        continue;
      }
      const uint64_t now = s.count(s.state);
      due |= now != s.seen;
      s.seen = now;
    }
    if (due) passes_unscanned_ = 0;
    return due;
  }

 private:
  struct Source {
    Count count;
    void* state;
    uint64_t seen;
  };
  std::vector<Source> sources_;
  bool rescan_ = true;
  unsigned passes_unscanned_ = 0;
};

}  // namespace hmc::core
