// Device memory on the point-to-point paths.
//
// Net providers here touch host memory only, so a message whose buffer is device memory
// moves one of two ways:
//   - IPC: a receiver on the same host offers its buffer as an IPC handle (CTS_IPC;
//     device memory it did not allocate too, by the provider's id of it); the sender
//     imports it once (cached) and writes with the device provider's copy
//     (NVLink / PCIe copy engine for GPU<->GPU, a host<->device copy for a CPU peer),
//     then sends FIN. Plain host memory allocated shareable is offered the same way.
//   - staging: the device side copies through a pinned host buffer and the host bytes
//     travel over the net provider as usual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/context_impl.h"
#include "core/ipc_imports.h"

namespace hmc::core {

// What a CTS_IPC message carries: the receiver's buffer as its host's processes import it.
// The handle names the whole allocation, so a peer imports it once however many
// messages land at different offsets of it.
struct IpcOffer {
  std::string provider;         // the device provider that exported it ("cuda", "cpu", ...)
  uint64_t alloc_id = 0;        // the exporter's allocation serial, never reused; 0: not its allocation
  uint64_t alloc_bytes = 0;     // size of the exported allocation
  uint64_t offset = 0;          // of the receive buffer inside it
  std::string device;           // its device as any process of the host names it (device_key), "" for host memory
  std::vector<uint8_t> handle;  // the provider's opaque handle of the allocation
};
// A device's name that every process of one host agrees on: its PCI bus id, else (a device
// without one, like the emulator's) "index:<n>".
std::string device_key(LoadedProvider& p, int device);
std::vector<uint8_t> encode_offer(const IpcOffer& offer);
// Which allocation an offer names, for one exporter: its allocation id, or for memory it
// did not allocate (id 0) a hash of the handle, marked by the top bit (ids count from 1
// and never get there).
uint64_t offer_key(const IpcOffer& offer);
Result<IpcOffer> decode_offer(const uint8_t* data, std::size_t len);

// Per communicator: pinned host staging buffers, and IPC copies still running on a device
// stream, into peer memory imported through the context's IpcImports. Used under the
// communicator's lock.
class DeviceTransfers {
 public:
  using Done = std::function<void(const Status&)>;
  explicit DeviceTransfers(ContextImpl& ctx);
  ~DeviceTransfers() { close(); }

  // An offer for [ptr, ptr+bytes), or nullopt when that memory cannot be exported
  // (plain host memory, a provider without IPC, cpu memory not allocated shareable).
  std::optional<IpcOffer> offer(const void* ptr, std::size_t bytes);
  // Writes `bytes` from local `src` into the memory `offer` of `peer` names (imported once
  // per process and allocation). An error return means nothing was started and `done` is never
  // called (kUnsupported: this process cannot import that memory). Otherwise `done` runs
  // once the bytes are in place: at once for a synchronous copy, from poll() for one
  // left running on a device stream (from device memory, with HMC_IPC_ASYNC, so that the
  // copy engine works while this thread goes on and queued copies run back to back), or
  // from finish_all().
  Status write(const PeerInfo& peer, const IpcOffer& offer, const void* src, std::size_t bytes, Done done);
  // Copies between local memories on a stream of `by`'s `device` and calls `done` once
  // the bytes are in place (from poll() or finish_all()); synchronously, `done` called
  // before returning, when `by` has no stream there. An error return: nothing started,
  // `done` never called. Staged transfers use it so that copies overlap the net.
  Status copy_async(LoadedProvider* by, int device, void* dst, const void* src, std::size_t bytes, Done done);
  // Completes the stream copies that have finished; true when one did.
  bool poll();
  // Whether stream copies are still running.
  bool busy() const { return !pending_.empty(); }
  // Waits for every running copy and ends it with `why` (abort, finalize).
  void finish_all(const Status& why);

  // A pinned host buffer of at least `bytes` (from the device's provider where it has
  // pinned memory), reused between messages; give it back with release().
  Result<uint8_t*> stage(const ContextImpl::MemInfo& near, std::size_t bytes);
  void release(uint8_t* buf);

  void close();

 private:
  // A copy queued on a device stream, ended by its event.
  struct Pending {
    LoadedProvider* by;
    int device;
    void* event;
    uint64_t import;  // the IpcImports use it writes into, released when it ends; 0: none
    Done done;
  };
  // Copies dst <- src: queued on a stream of by's `device` with an event behind it (holding
  // `import` until poll() sees it end), or synchronously, with `done` called before
  // returning, when device is -1 or `by` has no stream there. `import` is released however
  // the copy ends, also when it cannot start.
  Status start(LoadedProvider* by, int device, void* dst, const void* src, std::size_t bytes, uint64_t import,
               Done done);
  // A stream of `by` on `device` for IPC copies, created once; null when it has none.
  void* stream(LoadedProvider* by, int device);
  // The device whose stream copies from `from` into `offer`'s memory, or -1: synchronous.
  int stream_device(const ContextImpl::MemInfo& from, const IpcOffer& offer, LoadedProvider* target, LoadedProvider* by);
  // Waits (bounded by the context's timeout) for the oldest pending copy; its status.
  Status wait_one(Pending& p);

  ContextImpl& ctx_;
  IpcImports& imports_;
  bool async_ = true;  // HMC_IPC_ASYNC
  std::map<int, std::string> exporters_;  // peer rank -> its process, attached to imports_ until close()
  std::map<uint64_t, std::vector<uint8_t>> exports_;    // own alloc_id -> handle (empty: refused)
  // Of device memory HMC did not allocate: provider -> mem_query's id -> handle (empty: refused).
  std::map<LoadedProvider*, std::map<uint64_t, std::vector<uint8_t>>> foreign_exports_;
  struct Staging {
    Memory mem;
    bool in_use;
  };
  std::vector<Staging> staging_;
  std::map<std::pair<LoadedProvider*, int>, void*> streams_;  // (provider, device) -> stream
  struct IdleEvent {
    LoadedProvider* by;
    int device;
    void* event;
  };
  std::vector<IdleEvent> idle_events_;
  std::deque<Pending> pending_;  // in the order they were queued
  std::vector<std::pair<LoadedProvider*, int>> running_streams_;  // poll()'s scratch: streams seen busy
};

}  // namespace hmc::core
