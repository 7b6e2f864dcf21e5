// A listening socket: accepts connections on the io thread, waits for each
// one's hello, then hands it to `accept` (which never blocks).
#pragma once

#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/connection.h"

namespace hmc_net {

class StreamProvider;

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  using Acceptor = boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol>;

  Listener(StreamProvider& owner, Acceptor acceptor, std::string addr);

  void start();  // io thread
  void close();  // io thread: stop accepting, close connections not yet accepted
  // Caller threads: 0 with `out` and the hello, 1 when none waits,
  // HMC_PROV_ERR_TRUNCATED (nothing taken, *hello_len = size) when the hello does not fit.
  int pop(std::shared_ptr<Connection>& out, void* hello, size_t hello_cap, size_t* hello_len);
  const std::string& addr() const { return addr_; }

 private:
  void accept_next();
  void on_hello(const std::shared_ptr<Connection>& conn, bool ok);
  void sweep();  // io thread, once a second: closes connections past their hello's time
  void report(std::size_t late, std::size_t untaken);  // io thread: what sweep and make_room closed
  void make_room();  // io thread: closes the oldest waiting connection (strangers.h)

  StreamProvider& owner_;
  Acceptor acceptor_;
  std::string addr_;
  boost::asio::steady_timer retry_;
  boost::asio::steady_timer sweep_;
  const std::size_t max_waiting_;  // connections waiting at once (common/strangers.h)
  std::size_t crowded_out_ = 0;    // closed by make_room since the last report (io thread)
  bool closed_ = false;  // io thread
  // Connections not yet through their hello, and when each came (io thread).
  std::unordered_map<std::shared_ptr<Connection>, std::chrono::steady_clock::time_point> handshaking_;
  std::mutex mu_;
  // Through their hello, waiting for the host to take them, and when each came (oldest first).
  std::deque<std::pair<std::shared_ptr<Connection>, std::chrono::steady_clock::time_point>> ready_;
};

}  // namespace hmc_net
