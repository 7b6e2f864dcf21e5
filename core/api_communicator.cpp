// The public Communicator: argument checks, then CommImpl.
#include <cstring>
#include <limits>

#include "core/bootstrap.h"
#include "core/comm_impl.h"
#include "core/log.h"
#include "hmc/communicator.h"

namespace hmc {
namespace {

constexpr uint64_t kReservedTagBit = 1ull << 63;

Status check_peer(const core::CommImpl* c, int peer) {
  if (!c) return {ErrorCode::kInvalidArgument, "communicator is empty (moved from or never created)"};
  if (peer < 0 || peer >= c->size())
    return {ErrorCode::kInvalidArgument, "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(c->size()) + ")"};
  return {};
}

Status check_p2p(const core::CommImpl* c, const void* buf, std::size_t bytes, int peer, uint64_t tag) {
  HMC_RETURN_IF_ERROR(check_peer(c, peer));
  if (!buf && bytes) return {ErrorCode::kInvalidArgument, "null buffer with " + std::to_string(bytes) + " bytes"};
  HMC_RETURN_IF_ERROR(core::check_extent(buf, bytes, ""));
  if (tag & kReservedTagBit) return {ErrorCode::kInvalidArgument, "tags with the top bit set are reserved for collectives"};
  return c->usable();
}

// A 16-byte secret from text every rank of a launcher shares (weak; HMC_SECRET is better).
core::Secret derive_secret(const std::string& seed) {
  core::Secret s{};
  uint64_t h1 = 1469598103934665603ull, h2 = 0x9e3779b97f4a7c15ull;
  for (char c : seed) {
    h1 = (h1 ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    h2 = (h2 ^ static_cast<uint8_t>(c)) * 0x100000001b3ull + (h2 >> 7);
  }
  std::memcpy(s.data(), &h1, 8);
  std::memcpy(s.data() + 8, &h2, 8);
  return s;
}

}  // namespace

Communicator::Communicator() = default;
Communicator::Communicator(std::unique_ptr<core::CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

Result<Communicator> Communicator::create(Context& ctx, const UniqueId& id, int rank, int size) {
  if (!ctx.valid()) return core::empty_context("Communicator::create");
  auto impl = core::CommImpl::create(ctx.impl(), id, rank, size);
  if (!impl) return impl.status();
  return Communicator(std::move(impl.value()));
}

Result<Communicator> Communicator::from_env(Context& ctx) {
  if (!ctx.valid()) return core::empty_context("Communicator::from_env");
  auto& cfg = ctx.impl().config();
  auto first = [&](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names)
      if (cfg.is_set(n) && !cfg.str(n).empty()) return cfg.str(n);
    return {};
  };
  std::string rank_s = first({"HMC_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
  std::string size_s = first({"HMC_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  if (rank_s.empty() || size_s.empty())
    return Status(ErrorCode::kInvalidArgument, "from_env needs a rank and a size: set HMC_RANK/HMC_WORLD_SIZE "
                                               "(or run under torchrun, or Open MPI's mpirun: RANK/WORLD_SIZE, "
                                               "OMPI_COMM_WORLD_RANK/SIZE; other launchers' variables are not read)");
  constexpr long kMost = std::numeric_limits<int>::max();
  auto size = core::parse_number(size_s, 1, kMost, "world size");
  if (!size) return size.status();
  auto rank = core::parse_number(rank_s, 0, size.value() - 1, "rank");
  if (!rank) return rank.status();

  UniqueId id;
  std::string root = cfg.str("HMC_ROOT");
  bool start_root = rank.value() == 0;
  if (root.rfind("hmc1:", 0) == 0) {
    start_root = false;  // a whole unique id: whoever made it hosts the root
    auto parsed = UniqueId::parse(root);
    if (!parsed) return parsed.status();
    id = parsed.value();
  } else {
    if (root.empty() && cfg.is_set("MASTER_ADDR") && cfg.is_set("MASTER_PORT")) {
      // torchrun's own store holds MASTER_PORT: the bootstrap root takes the next port.
      auto port = core::parse_number(cfg.str("MASTER_PORT"), 1, 65534, "MASTER_PORT");
      if (!port) return port.status();
      root = cfg.str("MASTER_ADDR") + ":" + std::to_string(port.value() + 1);
    }
    if (root.empty() || root.find(':') == std::string::npos)
      return Status(ErrorCode::kInvalidArgument, "from_env needs the bootstrap root: HMC_ROOT=host:port "
                                                 "(or torchrun's MASTER_ADDR/MASTER_PORT)");
    if (auto parsed = core::parse_root(root); !parsed) return parsed.status();
    id.root = root;
    std::string secret = cfg.str("HMC_SECRET");
    if (!secret.empty()) {
      auto parsed = UniqueId::parse("hmc1:" + root + ":" + secret);
      if (!parsed) return Status(ErrorCode::kInvalidArgument, "HMC_SECRET must be 32 hex digits");
      id.secret = parsed->secret;
    } else {
      std::string job = first({"TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_hnp_uri"});
      if (job.empty()) HMC_LOG("core", warn, "no HMC_SECRET and no launcher job id: connections use a secret derived from HMC_ROOT, which anyone who knows the address can derive");
      id.secret = derive_secret(job + "|" + root);
    }
  }
  if (start_root) {
    const auto at = core::parse_root(id.root);
    if (!core::is_local_address(at->host))
      HMC_LOG("core", warn, "HMC_ROOT {} is not an address of this host, yet rank 0 starts the bootstrap root here: "
              "ranks that dial it will not find this root unless that address leads here", id.root);
    HMC_RETURN_IF_ERROR(ctx.impl().start_root(core::root_bind_host(at->host), at->port, id.secret));
  }
  return create(ctx, id, static_cast<int>(rank.value()), static_cast<int>(size.value()));
}

int Communicator::rank() const { return impl_ ? impl_->rank() : -1; }
int Communicator::size() const { return impl_ ? impl_->size() : 0; }

const PeerInfo& Communicator::peer(int rank) const {
  static const PeerInfo kNone;
  return check_peer(impl_.get(), rank).ok() ? impl_->peer_info(rank) : kNone;
}

const PathInfo& Communicator::path(int peer) const {
  static const PathInfo kNone;
  return check_peer(impl_.get(), peer).ok() ? impl_->path(peer) : kNone;
}

Request Communicator::isend(const void* buf, std::size_t bytes, int peer, uint64_t tag) {
  if (Status s = check_p2p(impl_.get(), buf, bytes, peer, tag); !s.ok()) return Request(core::Operation::failed(s));
  return Request(impl_->isend(buf, bytes, peer, tag));
}

Request Communicator::irecv(void* buf, std::size_t bytes, int peer, uint64_t tag) {
  if (Status s = check_p2p(impl_.get(), buf, bytes, peer, tag); !s.ok()) return Request(core::Operation::failed(s));
  return Request(impl_->irecv(buf, bytes, peer, tag));
}

Status Communicator::send(const void* buf, std::size_t bytes, int peer, uint64_t tag) {
  return isend(buf, bytes, peer, tag).wait();
}

// A receive that times out before any message matched it is withdrawn, so the caller may
// reuse `buf` at once and a later message matches a later receive.
Status Communicator::recv(void* buf, std::size_t bytes, int peer, uint64_t tag) {
  if (Status s = check_p2p(impl_.get(), buf, bytes, peer, tag); !s.ok()) return s;
  auto op = impl_->irecv(buf, bytes, peer, tag);
  Status s = Request(op).wait();
  if (s.code() != ErrorCode::kTimeout) return s;
  if (impl_->withdraw_recv(peer, op, s))
    return {ErrorCode::kTimeout, s.message() + "; the receive was withdrawn before any message matched it"};
  // Another thread's progress pass may have matched and ended it since the wait gave up:
  // its message is in `buf` (or its failure is the answer), and no later receive gets it.
  if (op->done()) return op->status();
  return s;
}

Result<MemoryRegion> Communicator::register_memory(void* ptr, std::size_t bytes) {
  if (!impl_) return Status(ErrorCode::kInvalidArgument, "communicator is empty");
  return impl_->register_memory(ptr, bytes);
}

Request Communicator::put(int peer, const void* src, std::size_t bytes, const RemoteKey& key, uint64_t offset,
                          std::optional<uint64_t> notify) {
  if (Status s = check_p2p(impl_.get(), src, bytes, peer, 0); !s.ok()) return Request(core::Operation::failed(s));
  return Request(impl_->put(peer, src, bytes, key, offset, notify));
}

Result<uint64_t> Communicator::wait_notify(int peer, std::chrono::milliseconds timeout) {
  HMC_RETURN_IF_ERROR(check_peer(impl_.get(), peer));
  return impl_->wait_notify(peer, core::deadline_after(timeout));
}

Result<uint64_t> Communicator::wait_notify(int peer) {
  HMC_RETURN_IF_ERROR(check_peer(impl_.get(), peer));
  return impl_->wait_notify(peer, impl_->context().deadline());
}

Status Communicator::barrier() {
  if (!impl_) return {ErrorCode::kInvalidArgument, "communicator is empty"};
  return impl_->barrier();
}

void Communicator::abort() {
  if (impl_) impl_->abort();
}

Status Communicator::finalize() {
  if (!impl_) return {ErrorCode::kInvalidArgument, "communicator is empty"};
  return impl_->finalize();
}

}  // namespace hmc
