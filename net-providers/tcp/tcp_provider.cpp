/*
 * tcp: HMC net provider over TCP sockets (Boost.Asio, Linux).
 *
 * Capabilities: MSG, PUT, REMOTE, SAME_HOST, MEM_HOST (host memory only).
 * Transport: one framed stream per connection (net-providers/common), served by
 * the provider's io thread. TCP_NODELAY; large socket buffers.
 * Puts are software one-sided writes: the initiator sends a put frame and the
 * payload from the caller's buffer; the target checks region id, key and bounds
 * against its own table, receives the payload straight into the region and
 * acks. The put request completes on that ack (the data is in the target's
 * memory) or fails with HMC_PROV_ERR_OUT_OF_BOUNDS on the target's nak.
 * Limits: messages up to 1 GiB; addresses are IP literals, "a.b.c.d:port" or
 * "[v6]:port" (no name resolution, so connect never blocks).
 * Props are model inputs for the cost model, not measurements.
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include <boost/asio/ip/tcp.hpp>
#include <charconv>
#include <iterator>

#include "common/port_range.h"
#include "common/stream_ops.h"
#include "hmc/provider/net.h"

namespace hmc_tcp {
namespace {

using hmc_net::Connection;

const hmc_param_t kParams[] = {
    {"HMC_TCP_ADDR", "string", "",
     "IP address to bind; empty: the host hint given to listen, or 0.0.0.0 without one"},
    {"HMC_TCP_PORT", "string", "0",
     "TCP port to bind: 0 picks an ephemeral port, N that port, LO-HI the first free one of the range (each rank of a "
     "host and each communicator of a process takes its own)"},
    {"HMC_TCP_SOCKBUF", "size", "4M",
     "SO_SNDBUF and SO_RCVBUF of every connection; 0 keeps the kernel's autotuning"},
};

constexpr uint32_t kRkeyMagic = 0x31504354;  // "TCP1"
constexpr double kLatencyUs = 15.0;          // model input: small message, one way
constexpr double kBandwidthGBps = 3.0;       // model input: large transfers

std::string format_endpoint(const boost::asio::ip::address& ip, uint16_t port) {
  std::string host = ip.to_string();
  if (ip.is_v6()) host = "[" + host + "]";
  return host + ":" + std::to_string(port);
}

// "1.2.3.4:5" or "[::1]:5" -> endpoint.
bool parse_endpoint(const std::string& text, boost::asio::ip::tcp::endpoint& out) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  const char* begin = text.data() + colon + 1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, port);
  if (ec != std::errc() || ptr != end || begin == end || port == 0 || port > 65535) return false;
  boost::system::error_code aec;
  auto ip = boost::asio::ip::make_address(host, aec);
  if (aec) return false;
  out = boost::asio::ip::tcp::endpoint(ip, static_cast<uint16_t>(port));
  return true;
}

class TcpProvider final : public hmc_net::StreamProvider {
 public:
  explicit TcpProvider(const hmc_host_services_t& host) : StreamProvider(host, "tcp") {}

  int configure(std::string& why) override {
    std::string ports;
    if (!host().get_string(kParams[0], bind_addr_, why) || !host().get_string(kParams[1], ports, why) ||
        !host().get_size(kParams[2], sockbuf_, why) ||
        !hmc_net::parse_port_range("HMC_TCP_PORT", ports.empty() ? "0" : ports, ports_, why)) {
      return HMC_PROV_ERR_INVALID;
    }
    boost::system::error_code ec;
    if (!bind_addr_.empty()) {
      boost::asio::ip::make_address(bind_addr_, ec);
      if (ec) {
        why = "HMC_TCP_ADDR: '" + bind_addr_ + "' is not an IP address";
        return HMC_PROV_ERR_INVALID;
      }
    }
    if (sockbuf_ > (uint64_t{1} << 30)) {
      why = "HMC_TCP_SOCKBUF: " + std::to_string(sockbuf_) + " bytes is more than 1 GiB";
      return HMC_PROV_ERR_INVALID;
    }
    return HMC_PROV_OK;
  }

  bool on_open(Connection& conn, std::string&) override {
    boost::system::error_code ec;
    tune(conn.socket());
    conn.socket().set_option(boost::asio::ip::tcp::no_delay(true), ec);
    if (conn.peer().empty()) {
      auto ep = conn.socket().remote_endpoint(ec);
      conn.set_peer(ec ? std::string("unknown peer") : describe(ep));
    }
    return true;
  }

 protected:
  uint32_t rkey_magic() const override { return kRkeyMagic; }

  int open_listener(const char* host_hint, Acceptor& acceptor, std::string& addr,
                    std::string& why) override {
    using boost::asio::ip::tcp;
    const std::string hint = host_hint;
    const std::string bind = !bind_addr_.empty() ? bind_addr_ : !hint.empty() ? hint : "0.0.0.0";
    boost::system::error_code ec;
    auto ip = boost::asio::ip::make_address(bind, ec);
    if (ec) {
      why = "bind address '" + bind + "' is not an IP address";
      return HMC_PROV_ERR_INVALID;
    }
    // The first port of the range that is free (one try for an ephemeral port).
    tcp::acceptor a(io());
    const auto in_use = [&] { return ec == boost::asio::error::address_in_use; };
    const uint16_t port = hmc_net::first_free_port(ports_, [&](uint16_t p) {
      boost::system::error_code ignored;
      a.close(ignored);  // the last try's
      const tcp::endpoint ep(ip, p);
      ec = {};
      a.open(ep.protocol(), ec);
      if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) tune(a);  // accepted sockets inherit the buffer sizes (and the window scale)
      if (!ec) a.bind(ep, ec);
      if (!ec) a.listen(boost::asio::socket_base::max_listen_connections, ec);
      return !ec;
    }, in_use);
    tcp::endpoint local;
    if (!ec) local = a.local_endpoint(ec);
    if (ec) {
      why = ports_.hi > ports_.lo && in_use() ? hmc_net::ports_taken("HMC_TCP_PORT", ports_, bind)
                                                : "cannot listen on " + format_endpoint(ip, port) + ": " + ec.message();
      return HMC_PROV_ERR_UNAVAILABLE;
    }
    // Peers cannot dial 0.0.0.0: publish the hint, or loopback without one.
    boost::asio::ip::address published = ip;
    if (ip.is_unspecified()) {
      published = boost::asio::ip::make_address(hint.empty() ? "127.0.0.1" : hint, ec);
      if (ec) {
        why = "host hint '" + hint + "' is not an IP address";
        return HMC_PROV_ERR_INVALID;
      }
    }
    addr = format_endpoint(published, local.port());
    acceptor = Acceptor(std::move(a));
    return HMC_PROV_OK;
  }

  int open_socket(const std::string& addr, Socket& socket, Endpoint& endpoint,
                  std::string& why) override {
    boost::asio::ip::tcp::endpoint ep;
    if (!parse_endpoint(addr, ep)) {
      why = "'" + addr + "' is not a tcp address (ip:port)";
      return HMC_PROV_ERR_INVALID;
    }
    endpoint = Endpoint(ep);
    boost::system::error_code ec;
    socket.open(endpoint.protocol(), ec);
    if (ec) {
      why = "cannot open a socket for " + addr + ": " + ec.message();
      return HMC_PROV_ERR_UNAVAILABLE;
    }
    tune(socket);
    socket.set_option(boost::asio::ip::tcp::no_delay(true), ec);
    return HMC_PROV_OK;
  }

 private:
  template <class S>
  void tune(S& s) {
    if (sockbuf_ == 0) return;
    boost::system::error_code ec;
    auto size = static_cast<int>(sockbuf_);
    s.set_option(boost::asio::socket_base::send_buffer_size(size), ec);
    s.set_option(boost::asio::socket_base::receive_buffer_size(size), ec);
  }

  static std::string describe(const Endpoint& ep) {
    char text[INET6_ADDRSTRLEN] = {};
    const sockaddr* sa = ep.data();
    if (sa->sa_family == AF_INET) {
      auto* in = reinterpret_cast<const sockaddr_in*>(sa);
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
      return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
    }
    if (sa->sa_family == AF_INET6) {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
      inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
      return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
    }
    return "unknown peer";
  }

  std::string bind_addr_;
  hmc_net::PortRange ports_;  // HMC_TCP_PORT
  uint64_t sockbuf_ = 0;
};

int props(void* state, hmc_net_props_t* props) {
  return hmc_net::ops::fill_props(state, props, kLatencyUs, kBandwidthGBps);
}

constexpr hmc_net_provider_t kTable = hmc_net::stream_table<TcpProvider>(
    "tcp",
    HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST |
        HMC_NET_CAP_MEM_HOST,
    kParams, std::size(kParams), props);

}  // namespace
}  // namespace hmc_tcp

extern "C" __attribute__((visibility("default"))) const hmc_net_provider_t* hmc_net_provider_v1(
    void) {
  return &hmc_tcp::kTable;
}
