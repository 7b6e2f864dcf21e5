// Bootstrap: the control plane of one communicator. A root (run by the process that made the
// job's unique id) accepts one TCP connection per rank, authenticates it with the job secret,
// and serves allgather/barrier as a star: every rank sends its blob to the root, the root sends
// everyone all blobs. The same connections carry liveness: a rank whose connection closes
// without a "bye" is reported lost to every other rank. Wire format: core/bootstrap_wire.h.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hmc/status.h"

namespace hmc::core {

using Secret = std::array<uint8_t, 16>;
using Clock = std::chrono::steady_clock;

// The bootstrap root's "host:port" (an IPv6 host in brackets) taken apart: a host that is
// not empty and a port from 1 to 65535 written in decimal, else kInvalidArgument.
struct RootAddress {
  std::string host;
  uint16_t port = 0;
};
Result<RootAddress> parse_root(const std::string& root);
// Where a root for peers that reach it at `host` listens: on loopback alone when `host` is a
// loopback address or "localhost" (every rank is on this host: nothing outside need reach
// it), else on every interface (a name may resolve here to another address than the peers
// see, as Debian's 127.0.1.1 for the host name). "" means every IPv4 interface, "::" (for
// an IPv6 `host`) every interface of both families.
std::string root_bind_host(const std::string& host);
// Whether `host` names an address of this machine (one it can bind); true where it does not
// resolve, which the connect then reports.
bool is_local_address(const std::string& host);
// A decimal number from `lo` to `hi`, all of `text`; `what` names it in the error.
Result<long> parse_number(const std::string& text, long lo, long hi, const std::string& what);

// Serves one job of `size` ranks on its own io thread. size is learnt from the first rank's
// hello; all must agree.
class BootstrapRoot {
 public:
  // Binds host:port (port 0 = ephemeral, host "" = 0.0.0.0).
  static Result<std::unique_ptr<BootstrapRoot>> start(const std::string& bind_host, uint16_t port,
                                                       const Secret& secret);
  uint16_t port() const;
  // Waits until no rank is in the job any more (each one that joined said bye or was lost; at
  // once when none joined), so that the process hosting the root can destroy it without
  // cutting off ranks that are still talking to it. Ranks that never joined are not waited for.
  Status wait_finished(Clock::time_point deadline);
  // Whether its job is over: ranks joined, and each said bye or was lost. Nothing is left
  // to serve, and nobody can join any more.
  bool over() const;
  // Stops the thread and closes everything; gives queued replies at most ~250 ms to drain.
  ~BootstrapRoot();

  BootstrapRoot(const BootstrapRoot&) = delete;
  BootstrapRoot& operator=(const BootstrapRoot&) = delete;

  class Impl;

 private:
  explicit BootstrapRoot(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One per communicator per rank: the rank's control connection to the root.
class Bootstrap {
 public:
  // Retries (refused, root not up yet, name not resolvable) with a short backoff until the
  // deadline, then authenticates. kRefused/kMismatch carry the root's reason.
  static Result<std::unique_ptr<Bootstrap>> connect(const std::string& root_host, uint16_t root_port,
                                                    const Secret& secret, int rank, int size,
                                                    Clock::time_point deadline);
  int rank() const;
  int size() const;
  // Local IP of the control connection (a hint for net providers' listen address).
  std::string local_ip() const;

  // Every rank contributes a blob (at most kMaxBlobBytes); every rank gets all blobs ordered by
  // rank. Calls are matched by a per-Bootstrap sequence number, so ranks may run ahead.
  Result<std::vector<std::vector<uint8_t>>> allgather(const std::vector<uint8_t>& mine,
                                                      Clock::time_point deadline);
  Status barrier(Clock::time_point deadline);

  // Liveness, thread-safe. A rank whose own root connection drops considers every peer lost.
  bool is_lost(int rank) const;
  std::vector<int> lost_peers() const;
  // Called on the bootstrap's io thread whenever the lost set changes. Set once, before use.
  void set_on_change(std::function<void()> fn);

  // Orderly leave: says bye and waits (until deadline, or for 2 s where the deadline is
  // sooner) for the root's acknowledgement; after it, closing is not a loss. Later calls fail with kFinalized.
  Status finalize(Clock::time_point deadline);
  // Closes at once without bye (peers will see this rank lost). Safe from any thread, any time.
  void abort();
  // Without finalize() this is an abort.
  ~Bootstrap();

  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  static constexpr size_t kMaxBlobBytes = (64u << 20) - 64;

  class Impl;

 private:
  explicit Bootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmc::core
