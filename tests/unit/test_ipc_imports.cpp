// Imports of peers' memory are closed once no communicator talks to their exporter
// (core/ipc_imports.h), but never while a stream waits on a flag of the context: closing
// waits for the whole device. A detach in that time closed nothing and nothing closed
// them later, so the peer's memory stayed mapped until the context ended.
#include <catch2/catch.hpp>

#include "core/context_impl.h"
#include "core/device_path.h"
#include "core/ipc_imports.h"
#include "core/plugin_registry.h"
#include "hmc/provider/device.h"

using namespace hmc::core;

namespace {

// Shareable host memory of the cpu provider, exported as a peer would offer it.
struct Exported {
  LoadedProvider* cpu = nullptr;
  void* ptr = nullptr;
  IpcOffer offer;
  static constexpr std::size_t kBytes = 1 << 16;
  explicit Exported(ContextImpl& ctx, uint64_t id) : cpu(ctx.registry().device("cpu")) {
    REQUIRE(cpu != nullptr);
    REQUIRE(cpu->dev->mem_alloc(cpu->state, 0, kBytes, HMC_ALLOC_SHAREABLE, &ptr) == 0);
    offer.provider = "cpu";
    offer.alloc_id = id;
    offer.alloc_bytes = kBytes;
    offer.handle.resize(HMC_IPC_HANDLE_MAX);
    std::size_t len = 0;
    REQUIRE(cpu->dev->ipc_export(cpu->state, ptr, kBytes, offer.handle.data(), offer.handle.size(), &len) == 0);
    offer.handle.resize(len);
  }
  ~Exported() { cpu->dev->mem_free(cpu->state, 0, ptr); }
};

}  // namespace

TEST_CASE("a detach while a stream waits closes the imports once it no longer does", "[ipc]") {
  auto made = ContextImpl::create({{{"HMC_PROVIDERS", "cpu"}}});
  REQUIRE(made.ok());
  ContextImpl& ctx = *made.value();
  IpcImports& imports = ctx.ipc_imports();
  Exported gone(ctx, 1), live(ctx, 2);
  imports.attach("host/1");
  imports.attach("host/2");
  auto use = imports.acquire("host/1", 1, gone.offer, gone.cpu);
  REQUIRE(use.ok());
  imports.release(use->id);
  REQUIRE(imports.open_imports() == 1);

  ctx.engine()->hold();  // a stream-ordered call is pending
  imports.detach("host/1");
  CHECK(imports.open_imports() == 1);  // cannot close now
  ctx.engine()->release();

  // The next use of any import, here another exporter's, closes it.
  auto other = imports.acquire("host/2", 2, live.offer, live.cpu);
  REQUIRE(other.ok());
  imports.release(other->id);
  CHECK(imports.open_imports() == 1);  // host/2's alone
  imports.detach("host/2");
  CHECK(imports.open_imports() == 0);
}
