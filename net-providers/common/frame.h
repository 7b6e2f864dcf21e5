// Wire format of hmc-net-stream connections (tcp and shm).
//
// Every frame is a fixed header followed by `length` payload bytes. Headers are
// written in host byte order: peers are little-endian hosts (checked below), so
// no byte swapping is spent on the data path. Writes are FIFO per connection,
// and the reader handles frames strictly in order: that is what makes "a message
// sent after a put is delivered after the put's data landed" hold.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace hmc_net {

static_assert(std::endian::native == std::endian::little,
              "hmc-net-stream frames are little-endian on the wire");

enum class FrameType : uint16_t {
  hello = 1,  // connector -> acceptor, first frame, payload = host hello blob
  msg = 2,    // send_msg payload
  put = 3,    // region/key/offset; payload lands in the target's registered region
  ack = 4,    // target -> initiator: put `seq` landed
  nak = 5,    // target -> initiator: put `seq` refused; status = code, payload = reason
  ring = 6,   // first frame after any hello (shm): payload = RingOffer (msg_ring.h)
  bell = 7,   // no payload: read the message ring, or write more into it (msg_ring.h)
};

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  int32_t status;  // nak: HMC_PROV_ERR_*
  uint32_t reserved;
  uint64_t length;  // payload bytes following the header
  uint64_t region;  // put: target region id
  uint64_t key;     // put: target region key
  uint64_t offset;  // put: byte offset in the region
  uint64_t seq;     // put/ack/nak: per-connection put sequence number
};
static_assert(sizeof(FrameHeader) == 56);

inline constexpr uint32_t kFrameMagic = 0x46434d48;  // "HMCF"
// A nak's reason text is short; anything longer is a protocol error.
inline constexpr uint64_t kMaxNakText = 1024;
// Largest send_msg; it also bounds what a peer can make us buffer for one message.
inline constexpr uint64_t kMaxMessage = uint64_t{1} << 30;

inline FrameHeader make_header(FrameType type, uint64_t length) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(type);
  h.length = length;
  return h;
}

}  // namespace hmc_net
