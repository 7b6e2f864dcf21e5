// Peer memory imported over IPC, shared by the communicators of one context.
//
// A driver maps an exporter's allocation into a process, not into one communicator: CUDA
// refuses an allocation that lies where an earlier import of a freed one is still mapped
// (cudaErrorAlreadyMapped; its allocator puts small allocations in blocks it keeps). With
// one cache per context, the import that blocks another is found and closed whichever
// communicator made it, and communicators between the same two processes import a buffer
// once. Keyed by the exporting process (host and pid) and its allocation (offer_key); the
// whole handle is compared on every hit, so a key that now names other memory (a pid used
// again) costs an import, never a write into the wrong memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hmc/status.h"

namespace hmc {
struct PeerInfo;
}

namespace hmc::core {

class ContextImpl;
struct LoadedProvider;
struct IpcOffer;

class IpcImports {
 public:
  explicit IpcImports(ContextImpl& ctx) : ctx_(ctx) {}
  ~IpcImports();
  IpcImports(const IpcImports&) = delete;
  IpcImports& operator=(const IpcImports&) = delete;

  // The exporting process a peer's offers come from.
  static std::string exporter(const PeerInfo& peer);

  // An import held open: copies may write [ptr, ptr + bytes) until release(id).
  struct Use {
    uint64_t id = 0;
    uint8_t* ptr = nullptr;
    uint64_t bytes = 0;
  };
  // The import of the allocation `offer` names (made now when needed, by `target`), held
  // for one copy. `rank` names the peer in messages. kUnsupported: it cannot be imported.
  Result<Use> acquire(const std::string& exporter, int rank, const IpcOffer& offer, LoadedProvider* target);
  // Registers a held import of host memory with `by`, the provider that copies into it.
  void pin(uint64_t id, LoadedProvider* by, std::size_t bytes);
  void release(uint64_t id);
  // A copy into it may still run after its deadline: forgets the import without closing it
  // (leaked rather than unmapped under the copy).
  void abandon(uint64_t id);
  // A communicator talks to `exporter` from now on / no longer: once none does, its
  // imports are closed (they hold the peer's memory alive).
  // A detach while a stream waits on a flag cannot close them (close_idle): the next
  // acquire that finds no flag pending does.
  void attach(const std::string& exporter);
  void detach(const std::string& exporter);
  // How many imports are open (tests).
  std::size_t open_imports();

 private:
  struct Import {
    std::string exporter;
    uint64_t key = 0;  // offer_key
    uint64_t id = 0;   // serial, never reused
    LoadedProvider* provider = nullptr;
    void* ptr = nullptr;
    uint64_t bytes = 0;
    uint64_t last_use = 0;
    int uses = 0;                         // copies holding it (acquire without release)
    LoadedProvider* pinned_by = nullptr;  // host_register'ed with this copier
    std::vector<uint8_t> handle;
  };
  using Imports = std::map<uint64_t, Import>;  // by id
  Imports::iterator find(const std::string& exporter, uint64_t key);
  void close(Import& imp);
  // Closes the idle imports for which `pick` holds; none while a stream waits on a flag
  // (closing waits for the whole device). Whether it closed one.
  template <class Pick>
  bool close_idle(Pick pick);
  // The idle imports of exporters no communicator talks to any more, once they can be closed.
  void close_orphans();

  // Imports hold the peer's memory alive, also after the peer freed it (collective scratch
  // comes and goes): beyond this many, the least recently used idle one is closed.
  static constexpr std::size_t kMaxImports = 64;
  ContextImpl& ctx_;
  std::mutex mu_;  // guards everything below; held while the provider imports and closes
  Imports imports_;
  std::map<std::string, int> attached_;  // exporter -> communicators that talk to it
  bool orphans_ = false;  // some detached exporter's imports are still open
  uint64_t next_id_ = 1;
  uint64_t uses_ = 0;
};

}  // namespace hmc::core
