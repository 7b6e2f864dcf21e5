// Provider state shared by the stream providers (tcp, shm): one io_context and
// its thread, the connection/listener/region/request tables, and the generic
// half of the net ABI. A transport derives from it and supplies sockets,
// addresses and, optionally, a direct (single-copy) put.
//
// Lock order: mu_ (tables) -> Connection::mu_ / Listener::mu_ -> request table;
// mu_ -> PutFence's. RegionTable::mutex() is taken alone. Host callbacks are never made while
// mu_ is held.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/connection.h"
#include "common/host.h"
#include "common/listener.h"
#include "common/put_fence.h"
#include "common/region_table.h"
#include "common/request.h"
#include "hmc/provider/net.h"

namespace hmc_net {

// Sets FD_CLOEXEC: a program the host process executes must not keep its connections open
// (a child holding a dead rank's socket would hide the death from its peers). asio opens
// and accepts without SOCK_CLOEXEC.
void close_on_exec(int fd);

class StreamProvider {
 public:
  using Socket = Connection::Socket;
  using Endpoint = Connection::Endpoint;
  using Acceptor = Listener::Acceptor;

  StreamProvider(const hmc_host_services_t& host, const char* name);
  StreamProvider(const StreamProvider&) = delete;
  StreamProvider& operator=(const StreamProvider&) = delete;
  virtual ~StreamProvider();

  // Reads parameters; non-zero with `why` refuses init.
  virtual int configure(std::string& why) = 0;
  void start();     // starts the io thread
  void shutdown();  // closes everything (pending requests fail CLOSED) and joins

  Host& host() { return host_; }
  boost::asio::io_context& io() { return io_; }
  RegionTable& regions() { return regions_; }

  // The generic half of hmc_net_provider_t (see net.h for each contract).
  int listen(const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len, void** listener);
  int close_listener(void* listener);
  int connect(const void* addr, size_t addr_len, const void* hello, size_t hello_len, void** conn);
  int conn_status(void* conn);
  int accept(void* listener, void** conn, void* hello, size_t hello_cap, size_t* hello_len);
  int close_conn(void* conn);
  int send_msg(void* conn, const void* buf, size_t len, void** req);
  int recv_msg(void* conn, void* buf, size_t cap, void** req);
  int reg_mem(void* ptr, size_t bytes, int mem_kind, void** mr);
  int dereg_mem(void* mr);
  int pack_rkey(void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len);
  int put(void* conn, const void* src, size_t len, const void* rkey, size_t rkey_len,
          uint64_t offset, void** req);
  int test(void* req, int* done, size_t* bytes, char* message, size_t message_cap);
  uint64_t events() const { return requests_.ends(); }  // the ABI's events (net.h)
  // Reads the connections' message rings: 1 when a request completed, else 0.
  int progress();
  // The ABI's idle (net.h): marks every ring's reader as gone, so writers ring bells.
  void idle();

  // Transport hooks called by Connection on the io thread.
  // After connect/accept: socket options, peer description, peer pid. False with `why`
  // refuses the peer: the connection closes (HMC_PROV_ERR_REFUSED).
  virtual bool on_open(Connection& conn, std::string& why) = 0;
  // One step (at most `budget` bytes) of a direct put: 0 done, kDirectMore,
  // kDirectUseStream, or HMC_PROV_ERR_* with `why`.
  virtual int direct_put(Connection& conn, DirectPut& put, size_t budget, std::string& why);
  // Message rings (msg_ring.h, connection.h). uses_rings: every connection offers
  // one (or none) first and sends no message before the peer's offer arrived.
  virtual bool uses_rings() const { return false; }
  // This side's incoming ring for a new connection; nullptr offers none.
  virtual std::unique_ptr<SharedRing> make_rx_ring() { return nullptr; }
  // The ring the peer offered, mapped here (io thread); nullptr keeps this side's
  // messages on the socket.
  virtual std::unique_ptr<SharedRing> map_peer_ring(Connection& conn, const RingOffer& offer) {
    return nullptr;
  }

 protected:
  virtual uint32_t rkey_magic() const = 0;
  // The shared file behind [ptr, ptr+bytes), if the transport uses one (shm).
  virtual RegionFile find_file(const void* ptr, size_t bytes) { return {}; }
  // Adds transport fields (shm: pid, address, descriptor, file) to a packed key.
  virtual void fill_rkey(Rkey& rkey, const RegionInfo& region) const {}
  // Whether puts on this connection go through direct_put.
  virtual bool use_direct(const Connection& conn) const { return false; }
  // Opens, binds and listens; writes the published address.
  virtual int open_listener(const char* host_hint, Acceptor& acceptor, std::string& addr,
                            std::string& why) = 0;
  virtual void listener_closed(const std::string& addr) {}
  // Parses a published address, opens `socket` for it, names the peer.
  virtual int open_socket(const std::string& addr, Socket& socket, Endpoint& endpoint,
                          std::string& why) = 0;

 private:
  void run_sync(const std::function<void()>& fn);
  std::shared_ptr<Connection> find_conn(void* conn);
  void update_rings_locked();
  // After region `id`'s key was cleared: the open connections' rings that show a step into it.
  std::vector<PutFence::Ring> rings_marking(uint64_t id);

  Host host_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  RegionTable regions_;
  PutFence put_fence_;
  RequestTable requests_;
  std::mutex mu_;
  std::unordered_map<void*, std::shared_ptr<Connection>> conns_;
  std::unordered_map<void*, std::shared_ptr<Listener>> listeners_;
  // The connections with a message ring, copied on change: progress reads a snapshot.
  using RingList = std::vector<std::shared_ptr<Connection>>;
  std::shared_ptr<const RingList> rings_;
  std::shared_ptr<const RingList> ring_snapshot();  // rings_, copied under mu_
  std::atomic<int64_t> last_progress_ns_{0};
};

}  // namespace hmc_net
