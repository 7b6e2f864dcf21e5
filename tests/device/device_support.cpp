#include "device_support.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <dlfcn.h>

#include "hmc/provider/device.h"

namespace hmc::test {
namespace {

int no_config(void*, const char*, char*, size_t) { return 1; }  // every parameter at its default

// A second instance of a device provider, in the role of the application's own runtime.
class ForeignAllocator {
 public:
  ~ForeignAllocator() {
    if (state_) table_->fini(state_);
    if (dl_) dlclose(dl_);
  }
  Status open(const std::string& path) {
    dl_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!dl_) return {ErrorCode::kUnavailable, std::string("dlopen: ") + dlerror()};
    auto entry = reinterpret_cast<hmc_device_entry_v1_fn>(dlsym(dl_, HMC_DEVICE_ENTRY_V1));
    if (!entry || !(table_ = entry())) return {ErrorCode::kUnavailable, path + " has no provider table"};
    services_ = {sizeof(services_), nullptr, nullptr, no_config, nullptr};
    char reason[256] = {};
    if (table_->init(&services_, &state_, reason, sizeof(reason)) != 0) {
      state_ = nullptr;
      return {ErrorCode::kUnavailable, std::string("second instance: ") + reason};
    }
    return {};
  }
  Result<std::shared_ptr<void>> alloc(int device, std::size_t bytes) {
    void* p = nullptr;
    if (table_->mem_alloc(state_, device, bytes, HMC_ALLOC_DEVICE, &p) != 0 || !p)
      return Status(ErrorCode::kNoMemory, std::string("foreign mem_alloc: ") + table_->last_error(state_));
    return std::shared_ptr<void>(p, [this, device](void* q) { table_->mem_free(state_, device, q); });
  }

 private:
  void* dl_ = nullptr;
  const hmc_device_provider_t* table_ = nullptr;
  void* state_ = nullptr;
  hmc_host_services_t services_{};
};

// This process's one, opened on first use (ranks are forked: each opens its own); never
// closed, as buffers may outlive any scope here.
Result<ForeignAllocator*> foreign_allocator(Context& ctx) {
  static ForeignAllocator* a = nullptr;
  if (a) return a;
  for (const auto& p : ctx.providers())
    if (p.kind == "device" && p.name == device_under_test()) {
      auto* fresh = new ForeignAllocator();
      if (Status s = fresh->open(p.origin); !s.ok()) {
        delete fresh;
        return s;
      }
      return a = fresh;
    }
  return Status(ErrorCode::kNotFound, "device provider " + device_under_test() + " is not loaded");
}

}  // namespace

std::string device_under_test() {
  const char* d = std::getenv("HMCTEST_DEVICE");
  return d && *d ? d : "emu";
}

namespace {

std::string probe_reason() {
  auto ctx = Context::create();
  if (!ctx) return "no context: " + ctx.status().to_string();
  for (const auto& p : ctx->providers())
    if (p.name == device_under_test()) return p.available ? "" : "device provider " + p.name + " " + p.reason;
  return "device provider " + device_under_test() + " is not loaded (HMC_PROVIDER_PATH, HMC_PROVIDERS)";
}

}  // namespace

// Asked in a child process: a vendor runtime initialised in the parent (CUDA, say) does
// not survive the fork of the ranks that run_ranks starts later.
std::string device_unavailable_reason() {
  std::string reason = "the availability check did not finish";
  auto exits = run_processes(1, [&](int) {
    std::string why = probe_reason();
    if (!why.empty()) std::printf("%s\n", why.c_str());
    std::fflush(stdout);
    return why.empty() ? 0 : 3;
  }, std::chrono::seconds(60));
  if (exits.size() == 1 && exits[0].exit_code == 0) return "";
  if (exits.size() == 1 && exits[0].exit_code == 3) return "unavailable (the reason is printed above)";
  return reason + ": " + describe(exits);
}

DeviceId device_for(Context& ctx, int rank) {
  int n = 0;
  for (const auto& d : ctx.devices())
    if (d.id.provider == device_under_test()) ++n;
  return {device_under_test(), n ? rank % n : 0};
}

Result<DevBuf> DevBuf::make(Context& ctx, const DeviceId& dev, std::size_t bytes, AllocKind kind) {
  DevBuf b;
  b.ctx = &ctx;
  b.host.assign(bytes, 0);
  if (dev.provider == "cpu" && kind == AllocKind::kDefault) {
    b.plain.reset(std::malloc(std::max<std::size_t>(bytes, 1)));  // plain host memory, unknown to HMC
    if (!b.plain) return Status(ErrorCode::kNoMemory, "malloc");
    return b;
  }
  auto mem = ctx.alloc(dev, std::max<std::size_t>(bytes, 1), kind);
  if (!mem) return mem.status();
  b.mem = std::move(mem.value());
  return b;
}

Result<DevBuf> DevBuf::make_foreign(Context& ctx, const DeviceId& dev, std::size_t bytes) {
  auto allocator = foreign_allocator(ctx);
  if (!allocator) return allocator.status();
  DevBuf b;
  b.ctx = &ctx;
  b.host.assign(bytes, 0);
  auto mem = allocator.value()->alloc(dev.index, std::max<std::size_t>(bytes, 1));
  if (!mem) return mem.status();
  b.foreign = std::move(mem.value());
  return b;
}

Status DevBuf::push() { return ctx->copy(ptr(), host.data(), host.size()); }
Status DevBuf::pull() { return ctx->copy(host.data(), ptr(), host.size()); }

}  // namespace hmc::test
