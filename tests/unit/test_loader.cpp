// The loader: discovery, selection, and a clear reason for every refusal.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "core/plugin_registry.h"
#include "core/progress.h"
#include "hmc/communicator.h"
#include "hmc/context.h"
#include "hmc/stream.h"
#include "hmc/provider/net.h"
#include "stderr_capture.h"

using namespace hmc;

namespace {

const ProviderInfo* find(const std::vector<ProviderInfo>& v, const std::string& name) {
  for (const auto& p : v)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

TEST_CASE("the loader says why it refused each plugin", "[loader]") {
  auto ctx = Context::create({{{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR}}});
  REQUIRE(ctx.ok());
  auto ps = ctx->providers();
  struct Want { const char* name; const char* reason; };
  for (Want w : {Want{"fakeunavail", "unavailable: libfakevendor.so.1 not found"},
                 Want{"fakeabi", "ABI version 2, this libhmc speaks 1"},
                 Want{"fakename", "table names 'somethingelse'"},
                 Want{"fakecaps", "capability put set but its functions are NULL"},
                 Want{"fakenoprogress", "a mandatory function (init, fini, props, listen, close_listener, connect, conn_status, accept, close_conn, test, progress) is NULL"},
                 Want{"fakenoentry", "no entry symbol hmc_net_provider_v1"},
                 Want{"fakegarbage", "unavailable: cannot load"},
                 Want{"fakenomsg", "unavailable: withdrew its messages"},
                 // Faults of the provider's own parameter table refuse it alone (one crashed
                 // the loader, the other failed the whole context).
                 Want{"fakenoparams", "refused: 2 parameters listed but no table of them"},
                 Want{"fakeunnamed", "refused: parameter 0 without name or type"},
                 // A name outside its own HMC_FAKECORES_* (here core's HMC_TIMEOUT, retyped: it
                 // would have changed core's default and failed every context whose user set
                 // HMC_TIMEOUT=30s). A name of core's inside the prefix: test_config.cpp.
                 Want{"fakecores", "refused: parameter HMC_TIMEOUT is not named HMC_FAKECORES_*"},
                 Want{"fakebaddefault", "refused: parameter HMC_FAKEBADDEFAULT_WAIT's default 'soon' is not a valid duration"},
                 // A reason without a NUL is cut at its buffer's end, not read past it.
                 Want{"fakelongwhy", "unavailable: xxxxxxxx"}}) {
    INFO(w.name);
    const ProviderInfo* p = find(ps, w.name);
    REQUIRE(p != nullptr);
    CHECK_FALSE(p->available);
    CHECK_THAT(p->reason, Catch::Contains(w.reason));
    CHECK(p->origin.find(HMC_FAKE_PLUGIN_DIR) == 0);
    CHECK(p->reason.size() < 600);
  }
  const ProviderInfo* cpu = find(ps, "cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->available);
}

// HMC_PROVIDER_PATH comes before libhmc's own folder, so its cpu plugin is the one tried.
TEST_CASE("a cpu plugin that cannot load leaves the built-in one", "[loader]") {
  auto ctx = Context::create({{{"HMC_PROVIDER_PATH", HMC_BROKEN_CPU_DIR}}});
  REQUIRE(ctx.ok());
  int tried = 0, built_in = 0;
  for (const auto& p : ctx->providers()) {
    if (p.kind != "device" || p.name != "cpu") continue;
    if (p.origin.find(HMC_BROKEN_CPU_DIR) == 0) {
      ++tried;
      CHECK_FALSE(p.available);
      CHECK_THAT(p.reason, Catch::Contains("cannot load"));
    } else if (p.origin == "built-in") {
      ++built_in;
      CHECK(p.available);
    }
  }
  CHECK(tried == 1);
  CHECK(built_in == 1);
  auto mem = ctx->alloc({"cpu", 0}, 4096);  // host memory through the built-in
  REQUIRE(mem.ok());
}

TEST_CASE("a net provider's withdrawn capabilities are gone from what the host reports", "[loader]") {
  // fakelocal's table says remote and same_host; its props withdraw remote (as ucx does
  // under UCX_TLS=shm), so peers on other hosts never negotiate it.
  auto ctx = Context::create({{{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR}, {"HMC_PROVIDERS", "cpu,fakelocal"}}});
  REQUIRE(ctx.ok());
  const auto providers = ctx->providers();
  const ProviderInfo* p = find(providers, "fakelocal");
  REQUIRE(p != nullptr);
  REQUIRE(p->available);
  CHECK_FALSE(p->caps & HMC_NET_CAP_REMOTE);
  CHECK(p->caps & HMC_NET_CAP_SAME_HOST);
  CHECK(std::find(p->cap_names.begin(), p->cap_names.end(), "remote") == p->cap_names.end());
  CHECK(std::find(p->cap_names.begin(), p->cap_names.end(), "same_host") != p->cap_names.end());
}

TEST_CASE("appended entries are read only from a table whose struct_size holds them", "[loader]") {
  // Both tables hold events and idle in memory; fakeshort's struct_size ends at progress.
  auto cfg = hmc::core::Config::load({{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR},
                                      {"HMC_PROVIDERS", "cpu,fakelocal,fakeshort"}});
  REQUIRE(cfg.ok());
  hmc::core::ProgressEngine engine;
  auto reg = hmc::core::PluginRegistry::load(cfg.value(), engine);
  REQUIRE(reg.ok());
  const hmc::core::LoadedProvider* full = reg.value()->net("fakelocal");
  const hmc::core::LoadedProvider* shorter = reg.value()->net("fakeshort");
  REQUIRE(full != nullptr);
  REQUIRE(shorter != nullptr);
  CHECK(full->net_events != nullptr);
  CHECK(full->net_idle != nullptr);
  CHECK(shorter->net_events == nullptr);
  CHECK(shorter->net_idle == nullptr);
}

TEST_CASE("HMC_PROVIDERS selects and excludes", "[loader]") {
  auto ctx = Context::create({{{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR}, {"HMC_PROVIDERS", "^fakeabi"}}});
  REQUIRE(ctx.ok());
  auto listed = ctx->providers();
  const ProviderInfo* p = find(listed, "fakeabi");
  REQUIRE(p != nullptr);
  CHECK_FALSE(p->available);
  CHECK_THAT(p->reason, Catch::Contains("not selected"));

  auto only = Context::create({{{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR}, {"HMC_PROVIDERS", "cpu,fakeunavail"}}});
  REQUIRE(only.ok());
  auto only_listed = only->providers();
  CHECK_THAT(find(only_listed, "fakename")->reason, Catch::Contains("not selected"));
  CHECK_THAT(find(only_listed, "fakeunavail")->reason, Catch::Contains("libfakevendor"));

  auto missing = Context::create({{{"HMC_PROVIDERS", "cpu,nosuch"}}});
  REQUIRE(missing.status().code() == ErrorCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("nosuch"));
}

// libhmc checks a provider's size parameters with its own grammar before the provider reads
// them; the provider must then read them alike, or it turns unavailable for a value that
// Context::create let through (its pairs then silently took another path).
TEST_CASE("a provider reads every size libhmc lets through", "[loader][config]") {
  for (const char* size : {"1.5M", "64Ki", "0.5MiB", "1e6", "2097152"}) {
    INFO(size);
    auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,tcp,shm"}, {"HMC_TCP_SOCKBUF", size}, {"HMC_SHM_RING", size}}});
    REQUIRE(ctx.ok());
    const auto providers = ctx->providers();
    for (const char* name : {"tcp", "shm"}) {
      const ProviderInfo* p = find(providers, name);
      REQUIRE(p != nullptr);
      INFO(name << ": " << p->reason);
      CHECK(p->available);
    }
  }
  auto bad = Context::create({{{"HMC_PROVIDERS", "cpu,tcp"}, {"HMC_TCP_SOCKBUF", "1.5"}}});  // no half bytes
  CHECK(bad.status().code() == ErrorCode::kInvalidArgument);
}

// A provider that was found but is not used registered no parameters: its settings are
// no typos (a cluster-wide HMC_SHM_DIR with HMC_PROVIDERS=cpu,tcp), and draw no warning.
TEST_CASE("a setting of a provider not used here is not reported as unknown", "[loader][config]") {
  const std::string said = hmc::test::stderr_of([] {
    auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,tcp"}, {"HMC_SHM_DIR", "/tmp"}, {"HMC_SHMM_DIR", "/tmp"}}});
    CHECK(ctx.ok());
  });
  INFO(said);
  CHECK(said.find("unknown setting HMC_SHM_DIR") == std::string::npos);
  CHECK(said.find("unknown setting HMC_SHMM_DIR") != std::string::npos);  // a typo still is
}

TEST_CASE("device memory API allocates, copies and tracks on the cpu provider", "[memory]") {
  auto ctx = Context::create();
  REQUIRE(ctx.ok());
  for (AllocKind kind : {AllocKind::kDefault, AllocKind::kPinnedHost, AllocKind::kShareable}) {
    auto a = ctx->alloc({"cpu", 0}, 1 << 20, kind);
    auto b = ctx->alloc({"cpu", 0}, 1 << 20, kind);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    std::memset(a->data(), 0x3C, a->size());
    std::memset(b->data(), 0, b->size());
    REQUIRE(ctx->copy(b->data(), a->data(), 1 << 20).ok());
    CHECK(static_cast<uint8_t*>(b->data())[12345] == 0x3C);
    CHECK(ctx->device_of(static_cast<uint8_t*>(a->data()) + 100) == DeviceId{"cpu", 0});
  }
  CHECK(ctx->alloc({"cpu", 7}, 16).status().code() == ErrorCode::kInvalidArgument);
  CHECK(ctx->alloc({"warp", 0}, 16).status().code() == ErrorCode::kNotFound);
  CHECK(ctx->alloc({"cpu", 0}, 0).status().code() == ErrorCode::kInvalidArgument);
  CHECK(ctx->copy(nullptr, ctx.value().devices().data(), 4).code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("a context without the cpu provider says why it has none", "[loader][config]") {
  auto excluded = Context::create({{{"HMC_PROVIDERS", "^cpu"}}});
  REQUIRE_FALSE(excluded.ok());
  CHECK(excluded.status().code() == ErrorCode::kUnavailable);
  CHECK_THAT(excluded.status().message(), Catch::Contains("cpu device provider") && Catch::Contains("not selected"));
  auto refused = Context::create({{{"HMC_CPU_SIMD", "avx9000"}}});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == ErrorCode::kUnavailable);
  CHECK_THAT(refused.status().message(), Catch::Contains("HMC_CPU_SIMD") && Catch::Contains("avx9000"));
}

TEST_CASE("a moved-from context refuses calls instead of dereferencing nothing", "[loader]") {
  auto made = Context::create();
  REQUIRE(made.ok());
  Context moved_from = std::move(made.value());
  Context live = std::move(moved_from);
  CHECK(live.valid());
  CHECK_FALSE(moved_from.valid());
  CHECK(moved_from.providers().empty());
  CHECK(moved_from.devices().empty());
  CHECK(moved_from.config().empty());
  CHECK(moved_from.alloc({"cpu", 0}, 64).status().code() == ErrorCode::kInvalidArgument);
  char a = 1, b = 0;
  CHECK(moved_from.copy(&b, &a, 1).code() == ErrorCode::kInvalidArgument);
  CHECK(moved_from.create_unique_id().status().code() == ErrorCode::kInvalidArgument);
  auto id = live.create_unique_id();
  REQUIRE(id.ok());
  auto comm = Communicator::create(moved_from, id.value(), 0, 1);
  CHECK(comm.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(comm.status().message(), Catch::Contains("moved from"));
  CHECK(Stream::create(moved_from, {"cpu", 0}).status().code() == ErrorCode::kInvalidArgument);
  CHECK(live.copy(&b, &a, 1).ok());
  CHECK(b == 1);
}

TEST_CASE("HMC_YIELD_EVERY takes 0 (automatic) or a count of polls", "[config]") {
  auto bad = Context::create({{{"HMC_YIELD_EVERY", "-1"}}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("HMC_YIELD_EVERY"));
  CHECK(Context::create({{{"HMC_YIELD_EVERY", "8"}}}).ok());
  CHECK(Context::create({{{"HMC_YIELD_EVERY", "0"}}}).ok());
}

// Set-up failures name the provider's code ("connecting to rank 2 ... failed:
// HMC_PROV_ERR_REFUSED"), not a bare number ("failed (code -7)").
TEST_CASE("provider return codes have their names in messages", "[loader]") {
  using hmc::core::provider_error_name;
  CHECK(provider_error_name(HMC_PROV_ERR_REFUSED) == "HMC_PROV_ERR_REFUSED");
  CHECK(provider_error_name(HMC_PROV_ERR_PEER_LOST) == "HMC_PROV_ERR_PEER_LOST");
  CHECK(provider_error_name(HMC_PROV_ERR_UNAVAILABLE) == "HMC_PROV_ERR_UNAVAILABLE");
  for (int rc = HMC_PROV_ERR_CLOSED; rc <= HMC_PROV_ERR_INTERNAL; ++rc)
    CHECK(provider_error_name(rc).rfind("HMC_PROV_ERR_", 0) == 0);
  CHECK(provider_error_name(-99) == "provider code -99");
}
