// Communicator: a group of ranks, the path to each peer, point-to-point and one-sided puts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/context.h"
#include "hmc/memory_region.h"
#include "hmc/request.h"
#include "hmc/status.h"
#include "hmc/types.h"
#include "hmc/unique_id.h"

namespace hmc {

namespace core {
class CommImpl;
}

// One way to reach a peer, as path negotiation saw it.
struct PathCandidate {
  std::string provider;     // net provider ("tcp", "shm") or "self"
  bool usable = false;
  std::string reason;       // why usable or not ("peer on another host", ...)
  double latency_us = 0;    // cost model inputs
  double bandwidth_gbps = 0;
  double cost_us_1mib = 0;  // the model's cost of a 1 MiB transfer, ranks usable candidates
};

struct PathInfo {
  int peer = -1;
  std::string provider;  // the chosen one
  std::string reason;    // why it won (or was forced by HMC_PATH)
  std::string device_path;  // how device memory moves to this peer (IPC, or staged through host)
  std::vector<PathCandidate> candidates;  // best first, unusable last
  // Messages up to this size travel inside one message; larger ones by rendezvous (the
  // receiver's buffer registered, the data put into it). HMC_EAGER_LIMIT, or the provider's
  // advice for this pair class where it is lower and HMC_EAGER_LIMIT is not set.
  std::size_t eager_limit = 0;
  // Rendezvous messages up to this size go by get (the sender's RTS carries its buffer's
  // key and the receiver reads it); larger ones, and all where this is 0, by put (the
  // receiver's CTS carries its buffer's key, the sender puts). HMC_RNDV and the path
  // provider's advice set it; SIZE_MAX: every size. A receive into device memory, or one
  // whose provider refuses the get, still asks for a put.
  std::size_t get_limit = 0;
  // ... and from this size up too (SIZE_MAX: none), where the provider advises a second
  // band; sizes between get_limit and it go by put.
  std::size_t get_from = SIZE_MAX;
  // Rendezvous messages from this size up are split (SIZE_MAX: never): the sender puts the
  // first half while the receiver gets the second, so both ranks copy at once. One host
  // only, where the provider advises gets (HMC_RNDV_SPLIT), and not while either rank has a
  // rendezvous of its own under way the other way; a receive that cannot (device memory, a
  // buffer outside HMC allocations) gets or asks for a put as above.
  std::size_t split_from = SIZE_MAX;
  // Rendezvous messages from this size up that are not split are copied in turns
  // (SIZE_MAX: never): after a message it got, a receiver asks the sender to put the next
  // one, if that goes into another buffer, so both ranks copy a stream. One host only, where
  // the provider advises gets (HMC_RNDV_TURNS); a receive that cannot (device memory, a
  // buffer outside HMC allocations) or whose rank has a rendezvous send of its own under
  // way gets.
  std::size_t turns_from = SIZE_MAX;
  // Eager flow control: how many bytes of eager messages (each counted with its 40-byte
  // header) this side may have sent to the peer that the peer's application has not yet
  // received. Past it, a message up to eager_limit waits for the peer's credit (up to
  // credit_wait, later sends to the peer waiting behind it), then goes by rendezvous; so a
  // receiver that falls behind buffers at most this much from each sender.
  // HMC_EAGER_WINDOW (unset: 256 KiB on one host, 1 MiB between hosts, at least 16 times
  // eager_limit; set: at least four messages of eager_limit); SIZE_MAX: no bound
  // (HMC_EAGER_WINDOW=0).
  std::size_t eager_window = 0;
  // HMC_CREDIT_WAIT (unset: 200 us between hosts, 0 on one host: at once).
  std::chrono::microseconds credit_wait{0};
};

struct PeerInfo {
  int rank = -1;
  std::string host;   // host identity (hostname + boot id)
  std::string hostname;
  int pid = 0;
  std::vector<std::string> net_providers;
  std::vector<DeviceInfo> devices;
  std::vector<std::string> ccl_providers;  // collective providers loaded and available
};

class Communicator {
 public:
  // Every rank calls this with the same id and size, each with its own rank.
  static Result<Communicator> create(Context& ctx, const UniqueId& id, int rank, int size);
  // Rank, size and root from the environment: HMC_RANK/HMC_WORLD_SIZE/HMC_ROOT
  // (+HMC_SECRET), torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (the bootstrap
  // root listens on MASTER_PORT + 1: torchrun's own store holds MASTER_PORT), or Open
  // MPI's OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE with HMC_ROOT. Called again with the
  // same variables (a new communicator after one ended), rank 0's root takes the port once
  // the earlier job is over on every rank, waiting up to HMC_TIMEOUT for that.
  static Result<Communicator> from_env(Context& ctx);

  Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  int rank() const;
  int size() const;
  const PeerInfo& peer(int rank) const;
  const PathInfo& path(int peer) const;

  // Tagged point-to-point. Tags with the top bit set are reserved for the collectives
  // (kInvalidArgument). A receive matches the first send of the same peer and
  // tag; its buffer must hold exactly the message, else the receive fails with
  // kMismatch, and so does the send when it goes by rendezvous (above the pair's eager
  // limit: PathInfo::eager_limit, or past its eager window for longer than its credit
  // wait: PathInfo::eager_window, credit_wait); an eager send has completed by then.
  // A send to this rank itself is eager at any size: it completes at once when no receive
  // of its tag is posted (the message is kept), and fails with the receive (kMismatch)
  // when the posted one does not fit.
  Request isend(const void* buf, std::size_t bytes, int peer, uint64_t tag = 0);
  Request irecv(void* buf, std::size_t bytes, int peer, uint64_t tag = 0);
  // Blocking forms: isend/irecv(...).wait(), HMC_TIMEOUT. A recv that times out before
  // any message matched it is withdrawn: `buf` is free at once and the next message
  // matches a later receive. Otherwise (a send, or a receive whose rendezvous is under
  // way) kTimeout leaves the operation posted, as Request::wait does, and `buf` in use
  // until it ends or abort() fails it.
  Status send(const void* buf, std::size_t bytes, int peer, uint64_t tag = 0);
  Status recv(void* buf, std::size_t bytes, int peer, uint64_t tag = 0);

  // One-sided. The region's key travels to peers by any means (e.g. send/recv). Host
  // memory must be mapped in this process for all `bytes` (else kInvalidArgument).
  Result<MemoryRegion> register_memory(void* ptr, std::size_t bytes);
  // Writes `bytes` from `src` at `offset` of the peer's region. The request
  // completes when `src` may be reused. With `notify`, the peer's wait_notify
  // returns the value once the data is visible there, in the order of the
  // puts; a put that fails notifies nobody. Over shm a put of host memory that
  // finds nothing queued to that peer is copied within this call (the copy is
  // the whole put); elsewhere it proceeds in the background.
  Request put(int peer, const void* src, std::size_t bytes, const RemoteKey& key,
              uint64_t offset, std::optional<uint64_t> notify = std::nullopt);
  // Waits for the next notification from `peer` (in the order they were sent). After
  // finalize() or abort() it fails at once, notifications not yet taken included.
  Result<uint64_t> wait_notify(int peer, std::chrono::milliseconds timeout);
  Result<uint64_t> wait_notify(int peer);

  // Waits until every rank arrived (control plane; collectives have a faster one). It
  // keeps this rank's operations moving meanwhile, so a peer's send that needs this rank's
  // answer before the peer arrives does not hold everyone.
  Status barrier();
  // Fails every pending and future operation with kAborted; safe at any time.
  void abort();
  // Orderly shutdown; later calls fail with kFinalized. Waits for this rank's sends; a
  // rendezvous-sized message that came for a receive not posted when finalize() began
  // (or that comes later and matches none) is refused, and its send fails on the sender
  // with kFinalized (an eager one is dropped). A receive another thread posts meanwhile
  // may thus miss its message; it fails with kFinalized at the end.
  Status finalize();

  core::CommImpl& impl() { return *impl_; }

 private:
  explicit Communicator(std::unique_ptr<core::CommImpl> impl);
  std::unique_ptr<core::CommImpl> impl_;
};

}  // namespace hmc
