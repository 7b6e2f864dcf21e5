/*
 * ucx: HMC net provider over UCP (UCX 1.13 as Debian 12 ships it).
 *
 * Capabilities: MSG, PUT, GET, REMOTE, SAME_HOST, MEM_HOST, MEM_ALLOC, POLLED. Debian's UCX has no
 * CUDA or ROCm support, so only host memory: core stages device memory.
 * Transports: whatever UCX selects (UCX_TLS, or HMC_UCX_TLS which overrides
 * it): tcp, posix/sysv shared memory, cma, verbs (rc/ud/dc, untested here).
 * Design (docs/ucx.md):
 *   - one ucp_context and worker per provider state, SERIALIZED under one
 *     mutex, plus a thread that sleeps on the worker's event fd (provider.h);
 *   - the published address is "ip:port" of a lifeline TCP listener: worker
 *     addresses (215 bytes with every transport here) exceed HMC_NET_ADDR_MAX,
 *     so the handshake on the lifeline exchanges them (lifeline.h);
 *   - messages are active messages in sequence per connection (conn.cpp);
 *   - registration is ucp_mem_map; mem_alloc is ucp_mem_map(ALLOCATE), the
 *     memory UCX's shared-memory transports put into with a memcpy (memory.cpp);
 *   - puts and gets follow a target-side key check: a memcpy through the mapping where
 *     the initiator maps the region (ucp_rkey_ptr), ucp_put_nbx + flush or ucp_get_nbx
 *     over verbs; elsewhere puts go as active messages that the target lands and gets
 *     are refused, so the host puts instead (HMC_UCX_PUT; put.cpp).
 * Limits: messages up to 1 GiB; packed UCP rkeys up to 216 bytes (the rest of
 * HMC_NET_RKEY_MAX is HMC's header). Props are cost-model inputs chosen by
 * transport class, not measurements of this machine.
 */
#include <iterator>
#include <memory>
#include <new>

#include "common/thunks.h"
#include "provider.h"

namespace hmc_ucx {
namespace {

int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  std::string why;
  try {
    if (state == nullptr) return HMC_PROV_ERR_INVALID;
    *state = nullptr;
    if (!hmc_net::Host::check(host, why)) {
      hmc_net::copy_text(why, reason, reason_len);
      return HMC_PROV_ERR_INVALID;
    }
    auto p = std::make_unique<Provider>(*host);
    if (int rc = p->start(why)) {
      hmc_net::copy_text(why, reason, reason_len);
      return rc;
    }
    *state = p.release();
    return HMC_PROV_OK;
  } catch (const std::exception& e) {
    hmc_net::copy_text(std::string("init failed: ") + e.what(), reason, reason_len);
    return HMC_PROV_ERR_INTERNAL;
  } catch (...) {
    hmc_net::copy_text("init failed", reason, reason_len);
    return HMC_PROV_ERR_INTERNAL;
  }
}

void fini(void* state) {
  try {
    delete static_cast<Provider*>(state);
  } catch (...) {
  }
}

int props(void* state, hmc_net_props_t* props) {
  if (props == nullptr || props->struct_size < HMC_NET_PROPS_V1_SIZE) return HMC_PROV_ERR_INVALID;
  return hmc_net::guarded<Provider>(state, [&](Provider& p) {
    p.props(*props);
    return HMC_PROV_OK;
  });
}

constexpr hmc_net_provider_t kTable = {
    .struct_size = sizeof(hmc_net_provider_t),
    .abi_version = HMC_NET_ABI_VERSION,
    .name = "ucx",
    .caps = HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST |
            HMC_NET_CAP_MEM_HOST | HMC_NET_CAP_MEM_ALLOC | HMC_NET_CAP_GET |
            // The worker moves in the host's calls; the thread takes it over only after
            // the host stopped polling (provider.h).
            HMC_NET_CAP_POLLED,
    .params = kParams,
    .num_params = std::size(kParams),
    .init = init,
    .fini = fini,
    .props = props,
    .listen = hmc_net::Thunks<Provider>::listen,
    .close_listener = hmc_net::Thunks<Provider>::close_listener,
    .connect = hmc_net::Thunks<Provider>::connect,
    .conn_status = hmc_net::Thunks<Provider>::conn_status,
    .accept = hmc_net::Thunks<Provider>::accept,
    .close_conn = hmc_net::Thunks<Provider>::close_conn,
    .send_msg = hmc_net::Thunks<Provider>::send_msg,
    .recv_msg = hmc_net::Thunks<Provider>::recv_msg,
    .reg_mem = hmc_net::Thunks<Provider>::reg_mem,
    .dereg_mem = hmc_net::Thunks<Provider>::dereg_mem,
    .pack_rkey = hmc_net::Thunks<Provider>::pack_rkey,
    .put = hmc_net::Thunks<Provider>::put,
    .test = hmc_net::Thunks<Provider>::test,
    .progress = [](void* s) { return hmc_net::guarded<Provider>(s, [&](Provider& p) { return p.progress(); }); },
    .mem_alloc = [](void* s, size_t bytes, void** ptr, void** mr) {
      return hmc_net::guarded<Provider>(s, [&](Provider& p) { return p.mem_alloc(bytes, ptr, mr); });
    },
    .mem_free = [](void* s, void* ptr, void* mr) {
      return hmc_net::guarded<Provider>(s, [&](Provider& p) { return p.mem_free(ptr, mr); });
    },
    .get = hmc_net::Thunks<Provider>::get,
    .events = hmc_net::Thunks<Provider>::events,
    .idle = hmc_net::Thunks<Provider>::idle,
};

}  // namespace
}  // namespace hmc_ucx

extern "C" __attribute__((visibility("default"))) const hmc_net_provider_t* hmc_net_provider_v1(
    void) {
  return &hmc_ucx::kTable;
}
