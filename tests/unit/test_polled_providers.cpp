// Which net providers a progress pass polls: those some communicator has a peer on.
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <optional>
#include <thread>

#include "core/context_impl.h"
#include "core/plugin_registry.h"
#include "hmc/hmc.h"

using namespace hmc;

TEST_CASE("a progress pass skips net providers nobody uses", "[progress][loader]") {
  auto ctx = Context::create({{{"HMC_PROVIDER_PATH", HMC_FAKE_PLUGIN_DIR}, {"HMC_PROVIDERS", "cpu,fakelocal"}}});
  REQUIRE(ctx.ok());
  void* so = dlopen(HMC_FAKE_PLUGIN_DIR "/libhmc-net-fakelocal.so", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(so != nullptr);
  auto* calls = static_cast<int*>(dlsym(so, "fake_progress_calls"));
  REQUIRE(calls != nullptr);
  core::LoadedProvider* fake = ctx->impl().registry().net("fakelocal");
  REQUIRE(fake != nullptr);
  auto& engine = *ctx->impl().engine();
  const int before = *calls;
  for (int i = 0; i < 100; ++i) engine.progress();
  CHECK(*calls == before);  // loaded, used by no communicator
  fake->users.fetch_add(1);
  for (int i = 0; i < 100; ++i) engine.progress();
  CHECK(*calls == before + 100);
  fake->users.fetch_sub(1);
  for (int i = 0; i < 100; ++i) engine.progress();
  CHECK(*calls == before + 100);
  dlclose(so);
}

// Two ranks as two threads of this process, each with its own context: shm is their path,
// so each context counts one user of shm (none of tcp) until its communicator closes.
TEST_CASE("a communicator uses its peers' provider from setup until it closes", "[progress]") {
  const ContextOptions opts{{{"HMC_PROVIDERS", "cpu,shm,tcp"}, {"HMC_TIMEOUT", "20000"}}};
  auto a = Context::create(opts);
  auto b = Context::create(opts);
  REQUIRE((a.ok() && b.ok()));
  auto id = a->create_unique_id();
  REQUIRE(id.ok());
  std::optional<Result<Communicator>> ca, cb;
  std::thread other([&] { cb.emplace(Communicator::create(b.value(), id.value(), 1, 2)); });
  ca.emplace(Communicator::create(a.value(), id.value(), 0, 2));
  other.join();
  REQUIRE(ca->ok());
  REQUIRE(cb->ok());
  REQUIRE(ca->value().path(1).provider == "shm");
  auto users = [](Context& c, const char* name) { return c.impl().registry().net(name)->users.load(); };
  CHECK(users(a.value(), "shm") == 1);
  CHECK(users(a.value(), "tcp") == 0);
  CHECK(users(b.value(), "shm") == 1);
  Status fb;
  std::thread closer([&] { fb = cb->value().finalize(); });
  Status fa = ca->value().finalize();
  closer.join();
  CHECK(fa.ok());
  CHECK(fb.ok());
  CHECK(users(a.value(), "shm") == 0);
  CHECK(users(b.value(), "shm") == 0);
}
