// The lifeline: a plain TCP connection per HMC connection, opened by the
// connector to the acceptor's published "ip:port". It carries the handshake
// (the hello and both UCX worker addresses, which can exceed HMC_NET_ADDR_MAX)
// and then nothing: it stays open so that the peer's exit or close_conn shows
// at once as end-of-file, whatever transport UCX uses (UCX notices a dead
// shared-memory peer only through its keepalive, tens of seconds later).
//
// All sockets are non-blocking; nothing here waits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hmc_ucx {

inline constexpr uint32_t kHandshakeMagic = 0x55434d48;  // "HMCU"
// 2: puts may come as active messages (kPutData/kPutDone), which a version 1 peer
// would leave unanswered. 3: kMsg carries the short header (kMsgWire), which a version 2
// peer drops.
inline constexpr uint32_t kHandshakeVersion = 3;
inline constexpr size_t kMaxWorkerAddress = 64 << 10;

// What each side tells the other. The connector's carries the hello.
struct Handshake {
  uint32_t conn = 0;    // the sender's connection id: put it in every AM header
  uint64_t cookie = 0;  // and this random value, so strangers cannot inject
  std::vector<char> hello;
  std::vector<char> worker;  // ucp_worker_get_address
};

std::string encode(const Handshake& h);
// 1: need more bytes; 0: `out` filled and `used` bytes consumed; <0: malformed (`why`).
int decode(const std::string& in, size_t max_hello, Handshake& out, size_t& used, std::string& why);

// Listening socket on ip:port (port 0: ephemeral). Returns the fd or -1 with `why`;
// `port` is set to the bound port.
int listen_socket(const std::string& ip, uint16_t& port, std::string& why);
// Starts a non-blocking connect to "ip:port"; the fd or -1 with `why`.
int connect_socket(const std::string& addr, std::string& why);
// Parses "a.b.c.d:port" or "[v6]:port".
bool parse_addr(const std::string& text, std::string& ip, uint16_t& port);
std::string format_addr(const std::string& ip, uint16_t port);
// "ip:port" of the far end of a connected socket.
std::string peer_name(int fd);
// Whether the far end closed (or the socket failed): the peer is gone or going.
bool ended(int fd);

}  // namespace hmc_ucx
