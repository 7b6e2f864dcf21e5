// Deregistration against single-copy puts (shm). A peer's direct put writes into
// this process's memory itself, so clearing a region's key stops only the puts
// that check it afterwards; a step that checked it before may still be copying.
// The peer marks each step in this side's ring of the connection (msg_ring.h,
// put_region), so dereg_mem clears the key, then waits here until no ring shows
// the region. A connection closed while a step was under way keeps its ring here
// until that step ends; a closed ring lets no new step begin (shut_puts).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/host.h"
#include "common/msg_ring.h"

namespace hmc_net {

// Whether process `pid` has exited, a zombie its parent did not reap yet included: it
// writes no more. Not while any of its threads runs (its main thread may have left by
// pthread_exit while another copies a put step).
bool process_gone(pid_t pid);

class PutFence {
 public:
  struct Ring {
    std::shared_ptr<SharedRing> ring;
    pid_t writer = 0;  // the peer process that marks it
  };

  // A connection was closed: shuts its ring to puts, and keeps it while a step runs.
  void closed(Ring r);
  // After region `id`'s key was cleared, before the open connections' rings are read:
  // pairs with SharedRing::put_begin's fence. A ring that does not show `id` then
  // shows no step that could still write there.
  static void after_clear() { std::atomic_thread_fence(std::memory_order_seq_cst); }
  static bool marks(const SharedRing& ring, uint64_t id) { return ring.put_region() == id + 1; }
  // Returns once no step into region `id` runs in `marked` (the open connections'
  // rings that marks() found) or in a ring kept by closed(). A step that has not
  // ended after kPatienceNs is logged and left, as is one whose writer died.
  void wait(uint64_t id, std::vector<Ring> marked, Host& host);

  // At shutdown, after closed() for every connection: returns once no kept ring
  // shows a step (the host may free any registered memory after fini).
  void drain(Host& host);

  static constexpr int64_t kPatienceNs = 10'000'000'000;

 private:
  void settle(const Ring& r, uint64_t mark, Host& host);
  void prune_locked();
  std::mutex mu_;
  std::vector<Ring> closing_;
};

}  // namespace hmc_net
