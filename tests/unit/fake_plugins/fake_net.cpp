// Deliberately broken or unavailable net providers, one per FAKE_KIND, to check that the
// loader refuses each with the right reason, and two that withdraw capabilities after init
// (5: its messages, so it is refused; 6: its reach to other hosts). 6 has the appended
// events and idle; 8 has them in memory too, but a struct_size that ends at progress, as
// the first v1 tables did: the host must not read them. 9 and 10 have broken parameter
// tables, 11 fills init's reason to its end without a NUL, 12 lists a setting of core's as
// its own. Never used outside tests.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "hmc/provider/net.h"

// How often the host called progress (kinds 5 and 6): the polling tests read it by dlsym.
extern "C" {
__attribute__((visibility("default"))) int fake_progress_calls = 0;
}

namespace {

int init_unavailable(const hmc_host_services_t*, void**, char* reason, size_t len) {
  std::snprintf(reason, len, "libfakevendor.so.1 not found");
  return HMC_PROV_ERR_UNAVAILABLE;
}

[[maybe_unused]] int init_unterminated(const hmc_host_services_t*, void**, char* reason, size_t len) {
  std::memset(reason, 'x', len);
  return HMC_PROV_ERR_UNAVAILABLE;
}

[[maybe_unused]] const hmc_param_t kUnnamed[] = {{nullptr, "int", "0", "a parameter without a name"}};
[[maybe_unused]] const hmc_param_t kCores[] = {{"HMC_TIMEOUT", "int", "5", "core's setting, retyped"}};
[[maybe_unused]] const hmc_param_t kBadDefault[] = {{"HMC_FAKEBADDEFAULT_WAIT", "duration", "soon", "a default that is no duration"}};

[[maybe_unused]] int init_ok(const hmc_host_services_t*, void** state, char*, size_t) {
  *state = nullptr;
  return HMC_PROV_OK;
}

// Kinds 5 and 6 load, then withdraw capabilities in props (caps_absent).
[[maybe_unused]] int props_withdrawing(void*, hmc_net_props_t* p) {
  p->latency_us = 1;
  p->bandwidth_gbps = 1;
  p->max_msg_size = 1 << 20;
#if FAKE_KIND == 5
  p->caps_absent = HMC_NET_CAP_MSG;
#else
  p->caps_absent = HMC_NET_CAP_REMOTE;
#endif
  return 0;
}

hmc_net_provider_t make_table() {
  hmc_net_provider_t t{};
  t.struct_size = sizeof(t);
  t.abi_version = HMC_NET_ABI_VERSION;
  t.name = FAKE_NAME;
  t.caps = HMC_NET_CAP_MSG;
  t.init = init_unavailable;
#if FAKE_KIND == 1  // newer ABI than the host speaks
  t.abi_version = HMC_NET_ABI_VERSION + 1;
#elif FAKE_KIND == 2  // table name differs from the file name
  t.name = "somethingelse";
#elif FAKE_KIND == 3  // capability bit without functions
  t.caps |= HMC_NET_CAP_PUT;
#elif FAKE_KIND == 5 || FAKE_KIND == 6 || FAKE_KIND == 8  // 5: withdraws its messages; 6: its reach to other hosts
  t.caps |= HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST | HMC_NET_CAP_MEM_HOST;
#endif
  // Fill the mandatory pointers with anything callable for kinds 0 and 1..3 tables checks.
  t.fini = [](void*) {};
  t.props = [](void*, hmc_net_props_t*) { return 0; };
  t.progress = [](void*) { return 0; };
#if FAKE_KIND == 5 || FAKE_KIND == 6
  t.init = init_ok;
  t.props = props_withdrawing;
  t.progress = [](void*) { return ++fake_progress_calls, 0; };
#elif FAKE_KIND == 8
  t.init = init_ok;
  t.struct_size = offsetof(hmc_net_provider_t, progress) + sizeof(t.progress);
#elif FAKE_KIND == 7  // every entry but progress
  t.progress = nullptr;
#elif FAKE_KIND == 9  // two parameters listed, no table
  t.num_params = 2;
#elif FAKE_KIND == 10
  t.params = kUnnamed;
  t.num_params = 1;
#elif FAKE_KIND == 11
  t.init = init_unterminated;
#elif FAKE_KIND == 12
  t.params = kCores;
  t.num_params = 1;
#elif FAKE_KIND == 13
  t.params = kBadDefault;
  t.num_params = 1;
#endif
  t.listen = [](void*, const char*, void*, size_t, size_t*, void**) { return -1; };
  t.close_listener = [](void*, void*) { return 0; };
  t.connect = [](void*, const void*, size_t, const void*, size_t, void**) { return -1; };
  t.conn_status = [](void*, void*) { return -1; };
  t.accept = [](void*, void*, void**, void*, size_t, size_t*) { return 1; };
  t.close_conn = [](void*, void*) { return 0; };
  t.send_msg = [](void*, void*, const void*, size_t, void**) { return -1; };
  t.recv_msg = [](void*, void*, void*, size_t, void**) { return -1; };
  t.test = [](void*, void*, int*, size_t*, char*, size_t) { return -1; };
#if FAKE_KIND == 6 || FAKE_KIND == 8
  t.events = [](void*) -> uint64_t { return 0; };
  t.idle = [](void*) {};
#endif
  return t;
}

const hmc_net_provider_t kTable = make_table();

}  // namespace

#if FAKE_KIND == 4  // no entry symbol at all
extern "C" __attribute__((visibility("default"))) int hmc_something_else(void) { return 0; }
#else
extern "C" __attribute__((visibility("default"))) const hmc_net_provider_t* hmc_net_provider_v1(void) { return &kTable; }
#endif
