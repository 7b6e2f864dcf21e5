#include "device_support.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hmc::test {

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

Status DevBuf::push() { return ctx->copy(ptr(), host.data(), host.size()); }
Status DevBuf::pull() { return ctx->copy(host.data(), ptr(), host.size()); }

}  // namespace hmc::test
