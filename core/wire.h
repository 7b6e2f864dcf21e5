// Wire formats core puts on net providers' message channels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hmc::core {

inline constexpr uint32_t kWireMagic = 0x31434d48;  // "HMC1"

// Every control message starts with this header.
enum class MsgType : uint32_t {
  kEager = 1,  // tag, size; the payload follows in the same message
  kRts,        // rendezvous request: tag, id = sender's op, size
  kCts,        // clear to send: id = sender's op, aux = receiver's op; payload = packed rkey
  kFin,        // rendezvous data landed: id = receiver's op, size
  kNak,        // receiver refused: id = sender's op; payload = reason text
  kNotify,     // put notification: aux = value
  kCtsIpc,     // clear to send into IPC memory: like kCts, payload = IpcOffer (core/device_path.h)
  kCtsRefused, // sender cannot use a CTS: id = receiver's op, size = sender's op; aux = 0:
               // send a plain kCts instead, else the ErrorCode that fails the receive;
               // payload = reason text
  kChunk,      // part of a staged rendezvous landed (sent after its put): id = receiver's op,
               // size = offset, aux = length; the receiver may move it on before kFin
  kGetDone,    // the receiver of a kRtsGet read the data itself: id = sender's op, size
  kCredit,     // eager flow control: aux = bytes of eager messages the receiver consumed
};
// kRts aux bit: the sender's buffer is device memory (the receiver may offer IPC memory).
inline constexpr uint64_t kRtsFromDevice = 1;
// kRts aux bit: the sender registered its (host) buffer and the payload is its packed key:
// the receiver may get the data and answer kGetDone, or answer kCts as to any kRts.
inline constexpr uint64_t kRtsGet = 2;
// kRts aux bit, with kRtsGet: the sender has no rendezvous receive under way, so its core
// is free to copy half of this message (kCtsSplit; rndv_split.cpp).
inline constexpr uint64_t kRtsSplit = 4;
// kRts aux bit, with kRtsGet: the same, for a size that copies in turns (HMC_RNDV_TURNS):
// the receiver may answer kCts for the sender to put this one (rndv_get.cpp).
inline constexpr uint64_t kRtsTurn = 8;
// kRts aux bit, with kRtsTurn: the sender has another rendezvous send to this peer under
// way, so the message is part of a stream (rndv_get.cpp).
inline constexpr uint64_t kRtsMore = 16;
// kCts tag bit: the receiver stages the bytes on their way to device memory, so the sender
// puts them in chunks, each followed by kChunk, for the receiver's copies to overlap.
inline constexpr uint64_t kCtsStaged = 1;
// kCts tag bit, answering a kRtsGet (rndv_split.cpp): the receiver gets the bytes from `size`
// on itself while the sender puts only [0, size) and answers kFin for that part; the send
// ends once both its put and the receiver's kGetDone did.
inline constexpr uint64_t kCtsSplit = 2;
// kCts tag bit, from a split receive whose get failed: the sender puts the rest as well,
// bytes [size, total), and answers kFin for it.
inline constexpr uint64_t kCtsRest = 4;

struct WireHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t tag;
  uint64_t id;
  uint64_t size;
  uint64_t aux;
};
static_assert(sizeof(WireHeader) == 40);

// What a control message carries besides its header is at most a packed rkey
// (HMC_NET_RKEY_MAX), an IPC offer or a reason text cut to kReasonMax: receive slots hold
// this much whatever the eager limit (HMC_EAGER_LIMIT may be 0).
inline constexpr std::size_t kCtrlPayloadMin = 1024;
inline constexpr std::size_t kReasonMax = 512;

// First bytes on every data connection: the host's authentication.
struct Hello {
  char magic[8];        // "HMCHELO"
  uint32_t version;     // kHelloVersion
  int32_t rank;         // the connecting rank
  uint8_t secret[16];   // the job secret
  uint64_t comm_id;     // which communicator this connection belongs to
  char provider[16];    // the provider both sides negotiated
};
inline constexpr uint32_t kHelloVersion = 1;

}  // namespace hmc::core
