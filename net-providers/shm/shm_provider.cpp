/*
 * shm: HMC net provider for processes of one host (Linux).
 *
 * Capabilities: MSG, PUT, SAME_HOST, MEM_HOST, SINGLE_COPY (host memory only).
 * Control and messages go over a Unix stream socket bound to a filesystem path
 * in HMC_SHM_DIR (mode 0600: peers are processes of this user, which on_open
 * checks too), so peers in other network namespaces (same filesystem) can
 * connect; the path is unlinked by close_listener and fini, and the first
 * provider of a process unlinks those that killed processes left (stale_sockets.h).
 * Puts are single copy: the initiator reads the target region's descriptor
 * (key, address, length, shared file) out of the target with
 * process_vm_readv, checks the key and bounds, and copies in queue order (on
 * the calling thread when nothing is queued on the connection, else on the io
 * thread): frames queued after the put leave only after the copy,
 * which gives net.h's ordering contract. The put completes when the data is
 * in the target's memory. A region in a MAP_SHARED file mapping whose fd the
 * target holds and that is sealed against shrinking (HMC_ALLOC_SHAREABLE memory:
 * a sealed memfd; not /dev/shm files, whose owner could shrink them under the
 * mapping and make the copy die of SIGBUS) is mapped
 * here through /proc/<pid>/fd/<fd> and written with memcpy (shared_file.h;
 * about twice as fast as CMA); any other region, or any failure to map (logged
 * once per connection at debug), is written with process_vm_writev
 * (cross-memory attach). A peer in this very process gets a memcpy.
 * If CMA is not permitted (EPERM, ENOSYS, a pid namespace that hides the
 * peer) the connection falls back to sending put data through the socket,
 * where the target checks and acks as in tcp (logged once, at info).
 * A process's first shm connection calls prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)
 * so Yama-restricted kernels let peers attach: any process of the same user may then
 * write this process's memory, which is what single copy needs (HMC_SHM_CMA=0 avoids
 * it; a process that makes no shm connection never calls it).
 * Messages go through a shared-memory ring per connection and direction
 * (common/msg_ring.h) that the receiver's caller threads read from `progress`,
 * so a small message costs no system call and no thread hop while both sides
 * poll; the socket carries a bell when the receiver has stopped polling. A
 * side writes into its peer's ring only where direct puts work (checked with
 * one process_vm_readv of the ring's nonce first), so no put goes through the
 * socket behind a message; elsewhere, or with HMC_SHM_RING=0, messages use
 * the socket.
 * Deregistration: each direct put step is marked in the target's ring of the
 * connection before it checks the descriptor, and dereg_mem waits until no
 * ring shows the region (common/put_fence.h), so no byte lands after it
 * returns. With HMC_SHM_RING=0 the ring is made for that mark alone; where
 * the peer's ring cannot be mapped, puts go through the socket.
 * Limits: messages up to 1 GiB.
 * Props are model inputs for the cost model, not measurements.
 */
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <boost/asio/local/stream_protocol.hpp>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>

#include "common/stream_ops.h"
#include "common/tsan.h"
#include "stale_sockets.h"
#include "hmc/provider/net.h"
#include "shm/shared_file.h"

namespace hmc_shm {
namespace {

using hmc_net::Connection;
using hmc_net::DirectPut;

const hmc_param_t kParams[] = {
    {"HMC_SHM_DIR", "string", "/tmp",
     "directory of the listening Unix sockets (filesystem paths work across network namespaces); "
     "each process's first shm provider unlinks the sockets there that this user's processes, gone, left"},
    {"HMC_SHM_CMA", "bool", "1",
     "single-copy puts with process_vm_writev (a process's first shm connection then lets any process "
     "of its user attach to it, for Yama's ptrace_scope 1); 0 sends put data through the socket"},
    {"HMC_SHM_MAP", "bool", "1",
     "single-copy puts into a peer region in a shared file sealed against shrinking "
     "(HMC_ALLOC_SHAREABLE memory) map it and use memcpy; 0 always uses process_vm_writev"},
    {"HMC_SHM_RING", "size", "512K",
     "shared-memory message ring of each connection, per direction (rounded up to a power of two, "
     "at least 64K); 0 sends messages through the socket"},
};

constexpr uint32_t kRkeyMagic = 0x314d4853;  // "SHM1"
constexpr double kLatencyUs = 5.0;           // model input: small message, one way
constexpr double kBandwidthGBps = 10.0;      // model input: large puts, about a memcpy
// Eager limit advised while puts are single copy: above it the rendezvous, which puts
// straight into the receive buffer, beat eager messages (ring, control slot, receive
// buffer) on the 2-vCPU VM at 24-64 KiB, for streams and for one message at a time
// (docs/performance.md, "shm's eager limit"); at 16 KiB they were level or eager won.
constexpr size_t kEagerLimitSameHost = size_t{16} << 10;
// process_vm_writev call size: 4 MiB pieces measured a little faster than one
// call for the whole put (the kernel pins fewer pages at a time).
constexpr uint64_t kCmaPiece = uint64_t{4} << 20;
constexpr size_t kSockNameMax = sizeof(sockaddr_un{}.sun_path) - 1;

std::string random_hex() {
  std::random_device device;
  char text[17];
  snprintf(text, sizeof(text), "%08x%08x", device(), device());
  return text;
}

class ShmProvider final : public hmc_net::StreamProvider {
 public:
  explicit ShmProvider(const hmc_host_services_t& host) : StreamProvider(host, "shm") {}

  // Whether puts are meant to be single copy (HMC_SHM_CMA); with 0 they go through the socket.
  bool single_copy_puts() const { return cma_; }

  int configure(std::string& why) override {
    if (!host().get_string(kParams[0], dir_, why) || !host().get_bool(kParams[1], cma_, why) ||
        !host().get_bool(kParams[2], map_, why) || !host().get_size(kParams[3], ring_, why)) {
      return HMC_PROV_ERR_INVALID;
    }
    struct stat st {};
    if (dir_.empty() || dir_[0] != '/' || ::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      why = "HMC_SHM_DIR: '" + dir_ + "' is not an existing directory (absolute path)";
      return HMC_PROV_ERR_INVALID;
    }
    if (socket_path(0).size() + 8 > kSockNameMax) {
      why = "HMC_SHM_DIR: '" + dir_ + "' is too long for a Unix socket path";
      return HMC_PROV_ERR_INVALID;
    }
    if (int stale = sweep_stale_sockets(dir_); stale > 0)
      host().log(HMC_LOG_DEBUG, "unlinked " + std::to_string(stale) + " socket file(s) of processes gone from " + dir_);
    if (cma_ && !regions().share_descriptors(why)) {
      host().log(HMC_LOG_INFO, why + "; peers check puts into this process with process_vm_readv");
      why.clear();
    }
    return HMC_PROV_OK;
  }

  // Only processes of this user are peers (the socket file is 0600 too): they may
  // write this process's memory, and it theirs.
  bool on_open(Connection& conn, std::string& why) override {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(conn.socket().native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      why = std::string("cannot read the peer's credentials: ") + strerror(errno);
      return false;
    }
    if (cred.uid != ::geteuid()) {
      why = "peer pid " + std::to_string(cred.pid) + " runs as uid " + std::to_string(cred.uid) +
            ", this process as uid " + std::to_string(::geteuid()) + " (shm connects processes of one user)";
      return false;
    }
    const int pid = cred.pid;
    if (cma_) allow_peers_to_attach();
    conn.set_peer_pid(pid);
    std::string who = "pid " + std::to_string(pid);
    conn.set_peer(conn.peer().empty() ? who : who + " at " + conn.peer());
    if (pid <= 0 && cma_) {
      conn.disable_direct();
      host().log(HMC_LOG_INFO, "peer pid not visible (another pid namespace?); puts to " +
                                   conn.peer() + " go through the socket");
    }
    return true;
  }

  int direct_put(Connection& conn, DirectPut& put, size_t budget, std::string& why) override;

  // Yama-restricted kernels (ptrace_scope 1) let a peer write this process's memory only if
  // the process allows it: once, when its first shm connection opens (before anything
  // tells the peer where to write), not at init, which every process that loads the
  // plugin runs. It stays for the process's life: another context may still use it.
  void allow_peers_to_attach() {
    static std::atomic<bool> allowed{false};
    if (allowed.exchange(true)) return;
    if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
      host().log(HMC_LOG_DEBUG, std::string("prctl(PR_SET_PTRACER) failed: ") + strerror(errno));
  }

  bool uses_rings() const override { return true; }

  // With HMC_SHM_RING=0 the ring carries only the peer's put marks (msg_ring.h).
  std::unique_ptr<hmc_net::SharedRing> make_rx_ring() override {
    if (!cma_) return nullptr;  // peers would not use it: puts go through the socket
    std::string why;
    auto ring = hmc_net::SharedRing::create(ring_, ring_ != 0, why);
    if (!ring) host().log(HMC_LOG_INFO, why + "; messages and puts to this process go through the socket");
    return ring;
  }

  std::unique_ptr<hmc_net::SharedRing> map_peer_ring(Connection& conn,
                                                     const hmc_net::RingOffer& offer) override;

 protected:
  uint32_t rkey_magic() const override { return kRkeyMagic; }

  hmc_net::RegionFile find_file(const void* ptr, size_t bytes) override {
    hmc_net::RegionFile file;
    if (cma_ && map_ && find_shared_file(ptr, bytes, file)) {
      host().log(HMC_LOG_DEBUG, "region of " + std::to_string(bytes) +
                                    " bytes lies in a shared file (fd " + std::to_string(file.fd) +
                                    "): peers map it");
    }
    return file;
  }

  void fill_rkey(hmc_net::Rkey& rkey, const hmc_net::RegionInfo& region) const override {
    rkey.pid = static_cast<uint64_t>(::getpid());
    rkey.addr = reinterpret_cast<uint64_t>(region.ptr);
    rkey.desc = reinterpret_cast<uint64_t>(region.desc);
    rkey.file_fd = region.file.fd;
    rkey.file_offset = region.file.offset;
    rkey.file_dev = region.file.dev;
    rkey.file_ino = region.file.ino;
    rkey.desc_fd = region.desc_file.fd;
    rkey.desc_offset = region.desc_file.offset;
    rkey.desc_dev = region.desc_file.dev;
    rkey.desc_ino = region.desc_file.ino;
  }

  bool use_direct(const Connection& conn) const override { return cma_ && conn.direct_ok(); }

  int open_listener(const char*, Acceptor& acceptor, std::string& addr, std::string& why) override {
    using boost::asio::local::stream_protocol;
    std::string path = socket_path(++counter_);
    // Bound under a name no sweep looks at, renamed once it listens: a sweeper in another
    // pid namespace would take a bound socket that refuses connections for a dead one's.
    const std::string fresh = path.substr(0, path.size() - 5) + ".new";
    boost::system::error_code ec;
    stream_protocol::acceptor a(io());
    a.open(stream_protocol(), ec);
    if (!ec) a.bind(stream_protocol::endpoint(fresh), ec);
    // Before listen: no connection of another user is ever queued (on_open checks it too).
    if (!ec && ::chmod(fresh.c_str(), 0600) != 0) ec.assign(errno, boost::system::system_category());
    if (!ec) a.listen(boost::asio::socket_base::max_listen_connections, ec);
    if (!ec && ::rename(fresh.c_str(), path.c_str()) != 0) ec.assign(errno, boost::system::system_category());
    if (ec) {
      why = "cannot listen on " + path + ": " + ec.message();
      if (ec != boost::asio::error::address_in_use) ::unlink(fresh.c_str());
      return HMC_PROV_ERR_UNAVAILABLE;
    }
    addr = path;
    acceptor = Acceptor(std::move(a));
    return HMC_PROV_OK;
  }

  void listener_closed(const std::string& addr) override { ::unlink(addr.c_str()); }

  int open_socket(const std::string& addr, Socket& socket, Endpoint& endpoint,
                  std::string& why) override {
    if (addr.empty() || addr[0] != '/' || addr.size() > kSockNameMax ||
        addr.find('\0') != std::string::npos) {
      why = "'" + addr + "' is not an shm address (absolute socket path)";
      return HMC_PROV_ERR_INVALID;
    }
    endpoint = Endpoint(boost::asio::local::stream_protocol::endpoint(addr));
    boost::system::error_code ec;
    socket.open(endpoint.protocol(), ec);
    if (ec) {
      why = "cannot open a socket for " + addr + ": " + ec.message();
      return HMC_PROV_ERR_UNAVAILABLE;
    }
    return HMC_PROV_OK;
  }

 private:
  std::string socket_path(uint64_t n) const {
    return dir_ + "/" + socket_name(static_cast<unsigned long>(n), random_hex());
  }
  int fall_back(Connection& conn, int err);
  static PeerMappings& peer_mappings(Connection& conn);
  bool read_desc(Connection& conn, const hmc_net::Rkey& rkey, hmc_net::DescWords& desc);
  char* mapped(Connection& conn, const hmc_net::Rkey& rkey, const hmc_net::DescWords& desc);

  std::string dir_;
  bool cma_ = true;
  bool map_ = true;
  uint64_t ring_ = 0;
  std::atomic<uint64_t> counter_{0};
};

// CMA is not allowed toward this peer: this and later puts use the socket, unless
// messages already go through the peer's ring (a put on the socket would fall behind
// them): then they fail (UNSUPPORTED).
int ShmProvider::fall_back(Connection& conn, int err) {
  conn.disable_direct();
  const bool ring = conn.put_ring() != nullptr && conn.put_ring()->carries_messages();
  host().log(ring ? HMC_LOG_WARN : HMC_LOG_INFO,
             "cross-memory attach to " + conn.peer() + " unavailable (" + strerror(err) + "); " +
                 (ring ? "puts on this connection fail from now on (its messages use the peer's ring)"
                       : "puts on this connection go through the socket"));
  return hmc_net::kDirectUseStream;
}

// Messages take the peer's ring only where direct puts work: a put through the
// socket would fall behind the messages sent after it. One process_vm_readv of the
// ring's nonce checks that first (it needs the permission a write does, and writes
// nothing where an offer that is no longer the peer's points).
std::unique_ptr<hmc_net::SharedRing> ShmProvider::map_peer_ring(Connection& conn,
                                                                const hmc_net::RingOffer& offer) {
  const int pid = conn.peer_pid();
  if (offer.fd < 0 || pid <= 0 || !use_direct(conn)) return nullptr;
  uint64_t word = 0;
  iovec local{&word, sizeof(word)};
  iovec remote{reinterpret_cast<void*>(offer.probe_addr), sizeof(word)};
  if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof(word))) {
    if (errno == EPERM || errno == ENOSYS) fall_back(conn, errno);
    return nullptr;
  }
  if (word != offer.nonce) return nullptr;  // that ring is gone (map would refuse it too)
  std::string why;
  auto ring = hmc_net::SharedRing::map(
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(offer.fd), offer, why);
  if (!ring) {
    host().log(HMC_LOG_INFO, "cannot map the message ring of " + conn.peer() + " (" + why +
                                 "); messages and puts to it go through the socket");
  }
  return ring;
}

int ShmProvider::direct_put(Connection& conn, DirectPut& put, size_t budget, std::string& why) {
  const pid_t pid = conn.peer_pid();
  const bool self = pid == ::getpid();
  const uint64_t region = put.rkey.region;
  auto lost = [&](int err) {
    why = "peer lost: process " + std::to_string(pid) + " is gone (" + strerror(err) + ")";
    return HMC_PROV_ERR_PEER_LOST;
  };

  // Queued before the connection knew its peer could not be attached to, or the peer's
  // ring could not be mapped: without it, the peer's deregistration could not wait for
  // this step (common/put_fence.h), so the target checks the put itself. (The ring is
  // the connection's for good once direct puts run: never missing after a first step.)
  hmc_net::SharedRing* ring = conn.put_ring();
  if (ring == nullptr || (put.done == 0 && (!conn.direct_ok() || pid <= 0))) return hmc_net::kDirectUseStream;
  // Marked before the descriptor check, cleared once the step's bytes are in place.
  if (!ring->put_begin(region)) {
    why = "peer lost: " + conn.peer() + " closed the connection during a put to it";
    return HMC_PROV_ERR_PEER_LOST;
  }
  struct StepEnd {
    hmc_net::SharedRing* ring;
    uint64_t region_base = 0;  // once known: what dereg_mem acquires (common/tsan.h)
    ~StepEnd() {
      if (region_base != 0) hmc_net::tsan_release(reinterpret_cast<const void*>(region_base));
      ring->put_end();
    }
  } step_end{ring};

  // The target's table is the authority: read the region descriptor every step.
  hmc_net::DescWords desc{};
  ssize_t n = sizeof(desc);
  if (!read_desc(conn, put.rkey, desc)) {
    iovec local{&desc, sizeof(desc)};
    iovec remote{reinterpret_cast<void*>(put.rkey.desc), sizeof(desc)};
    n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  }
  if (n < 0 && (errno == EPERM || errno == ENOSYS) && put.done == 0) return fall_back(conn, errno);
  if (n < 0 && errno == ESRCH) return lost(errno);
  if (n != static_cast<ssize_t>(sizeof(desc)) || desc.key == 0 || desc.key != put.rkey.key ||
      desc.check != hmc_net::desc_check(desc)) {
    if (auto* maps = static_cast<PeerMappings*>(conn.transport_state()))
      maps->forget(region, put.rkey.key);
    // A peer that tears down closes its connections before it releases its regions
    // (abort, finalize): a region gone from a peer that hung up is the peer gone, not a
    // stale key, even where this side has not read the end of the socket yet.
    if (conn.peer_hung_up()) {
      why = "peer lost: " + conn.peer() + " closed the connection during a put to it";
      return HMC_PROV_ERR_PEER_LOST;
    }
    why = "put refused: region " + std::to_string(region) + " is not registered at " + conn.peer() +
          " (stale or forged remote key)";
    return HMC_PROV_ERR_OUT_OF_BOUNDS;
  }
  if (put.offset > desc.len || put.len > desc.len - put.offset) {
    why = "put refused: write of " + std::to_string(put.len) + " bytes at offset " +
          std::to_string(put.offset) + " leaves region " + std::to_string(region) + " (" +
          std::to_string(desc.len) + " bytes)";
    return HMC_PROV_ERR_OUT_OF_BOUNDS;
  }

  step_end.region_base = desc.addr;
  const uint64_t step = std::min<uint64_t>(put.len - put.done, budget);
  const char* src = put.src + put.done;
  const uint64_t dst = desc.addr + put.offset + put.done;
  char* base = nullptr;
  if (self) {
    if (step > 0) std::memcpy(reinterpret_cast<void*>(dst), src, step);
    put.done += step;
  } else if (step > 0 && (base = mapped(conn, put.rkey, desc)) != nullptr) {
    std::memcpy(base + put.offset + put.done, src, step);
    // Stores (non-temporal ones included) are globally visible before the
    // frames behind the put are written.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    put.done += step;
  } else {
    uint64_t moved = 0;
    while (moved < step) {
      const auto piece = static_cast<size_t>(std::min<uint64_t>(step - moved, kCmaPiece));
      iovec l{const_cast<char*>(src + moved), piece};
      iovec r{reinterpret_cast<void*>(dst + moved), piece};
      ssize_t w = ::process_vm_writev(pid, &l, 1, &r, 1, 0);
      if (w > 0) {
        moved += static_cast<uint64_t>(w);
        continue;
      }
      int err = w < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      if ((err == EPERM || err == ENOSYS) && put.done == 0 && moved == 0)
        return fall_back(conn, err);
      if (err == ESRCH) return lost(err);
      why = "put to " + conn.peer() + " failed after " + std::to_string(put.done + moved) +
            " bytes: process_vm_writev: " + strerror(err);
      return err == EFAULT ? HMC_PROV_ERR_OUT_OF_BOUNDS : HMC_PROV_ERR_INTERNAL;
    }
    put.done += moved;
  }
  return put.done == put.len ? HMC_PROV_OK : hmc_net::kDirectMore;
}

PeerMappings& ShmProvider::peer_mappings(Connection& conn) {
  auto* maps = static_cast<PeerMappings*>(conn.transport_state());
  if (maps != nullptr) return *maps;
  auto fresh = std::make_unique<PeerMappings>();
  maps = fresh.get();
  conn.set_transport_state(std::move(fresh));
  return *maps;
}

// The descriptor `rkey` names, loaded from the target's memfd of descriptors mapped here
// (a few loads, where process_vm_readv costs a system call: 1.1 us on the development VM,
// more than a 64 KiB memcpy). False when the key names no such memfd or it cannot be
// mapped (logged once per connection): the caller reads with process_vm_readv then.
bool ShmProvider::read_desc(Connection& conn, const hmc_net::Rkey& rkey, hmc_net::DescWords& desc) {
  if (rkey.desc_fd < 0) return false;
  PeerMappings& maps = peer_mappings(conn);
  std::string why;
  const hmc_net::RegionDesc* d = maps.descriptor(
      conn.peer_pid(), hmc_net::RegionFile{rkey.desc_fd, rkey.desc_offset, rkey.desc_dev, rkey.desc_ino}, why);
  if (d == nullptr) {
    if (!why.empty())
      host().log(HMC_LOG_DEBUG, "cannot map the region descriptors of " + conn.peer() + " (" + why +
                                    "); puts to it read them with process_vm_readv");
    return false;
  }
  // Key first (the owner stores it last when it registers, first when it deregisters);
  // a slot reused meanwhile fails the check word.
  desc.key = d->key.load(std::memory_order_acquire);
  desc.addr = d->addr.load(std::memory_order_relaxed);
  desc.len = d->len.load(std::memory_order_relaxed);
  desc.file_fd = d->file_fd.load(std::memory_order_relaxed);
  desc.file_offset = d->file_offset.load(std::memory_order_relaxed);
  desc.file_dev = d->file_dev.load(std::memory_order_relaxed);
  desc.file_ino = d->file_ino.load(std::memory_order_relaxed);
  desc.check = d->check.load(std::memory_order_relaxed);
  return true;
}

// The region mapped into this process, if it lies in a shared file of the
// peer and mapping is allowed; nullptr means process_vm_writev. The file is
// the descriptor's (the target's authority); the key must name the same one.
char* ShmProvider::mapped(Connection& conn, const hmc_net::Rkey& rkey,
                          const hmc_net::DescWords& desc) {
  const hmc_net::RegionFile file = desc.file();
  if (!map_ || file.fd < 0) return nullptr;
  if (rkey.file_fd != file.fd || rkey.file_offset != file.offset || rkey.file_dev != file.dev ||
      rkey.file_ino != file.ino) {
    return nullptr;
  }
  PeerMappings& maps = peer_mappings(conn);
  std::string why;
  char* base = maps.find_or_map(conn.peer_pid(), rkey.region, desc.key, desc.len, file, why);
  if (base == nullptr && !why.empty() && maps.first_fallback()) {
    host().log(HMC_LOG_DEBUG, "cannot map a shared region of " + conn.peer() + " (" + why +
                                  "); puts into it use process_vm_writev");
  }
  return base;
}

int props(void* state, hmc_net_props_t* props) {
  const int rc = hmc_net::ops::fill_props(state, props, kLatencyUs, kBandwidthGBps);
  if (rc != HMC_PROV_OK || state == nullptr) return rc;
  if (props->struct_size >= offsetof(hmc_net_props_t, eager_limit_same_host) + sizeof(size_t))
    props->eager_limit_same_host = static_cast<ShmProvider*>(state)->single_copy_puts() ? kEagerLimitSameHost : 0;
  return HMC_PROV_OK;
}

constexpr hmc_net_provider_t kTable = hmc_net::stream_table<ShmProvider>(
    "shm",
    HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_SAME_HOST | HMC_NET_CAP_MEM_HOST |
        HMC_NET_CAP_SINGLE_COPY,
    kParams, std::size(kParams), props);

}  // namespace
}  // namespace hmc_shm

extern "C" __attribute__((visibility("default"))) const hmc_net_provider_t* hmc_net_provider_v1(
    void) {
  return &hmc_shm::kTable;
}
