// The C ABI side of a stream provider: init, fini, props and progress here, the per-method
// entry points in common/thunks.h; stream_table() builds a transport's whole table.
#pragma once

#include <memory>
#include <new>
#include <string>

#include "common/stream_provider.h"
#include "common/thunks.h"

namespace hmc_net {

namespace ops {
void fini(void* state);
int fill_props(void* state, hmc_net_props_t* props, double latency_us, double bandwidth_gbps);
int progress(void* state);
}  // namespace ops

// init for transport P (a StreamProvider constructible from the host services).
template <class P>
int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  std::string why;
  try {
    if (state == nullptr) {
      copy_text("no state pointer", reason, reason_len);
      return HMC_PROV_ERR_INVALID;
    }
    *state = nullptr;
    if (!Host::check(host, why)) {
      copy_text(why, reason, reason_len);
      return HMC_PROV_ERR_INVALID;
    }
    auto p = std::make_unique<P>(*host);
    if (int rc = p->configure(why)) {
      copy_text(why, reason, reason_len);
      return rc;
    }
    p->start();
    StreamProvider* base = p.release();
    *state = base;
    return HMC_PROV_OK;
  } catch (const std::bad_alloc&) {
    copy_text("out of memory", reason, reason_len);
    return HMC_PROV_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    copy_text(std::string("init failed: ") + e.what(), reason, reason_len);
    return HMC_PROV_ERR_INTERNAL;
  } catch (...) {
    copy_text("init failed", reason, reason_len);
    return HMC_PROV_ERR_INTERNAL;
  }
}

// The whole ABI table of a stream transport: only its name, capabilities, parameters,
// init type and cost-model props differ between tcp and shm.
template <class P>
constexpr hmc_net_provider_t stream_table(const char* name, uint64_t caps, const hmc_param_t* params,
                                          size_t num_params, int (*props)(void*, hmc_net_props_t*)) {
  return {
      .struct_size = sizeof(hmc_net_provider_t),
      .abi_version = HMC_NET_ABI_VERSION,
      .name = name,
      .caps = caps,
      .params = params,
      .num_params = num_params,
      .init = init<P>,
      .fini = ops::fini,
      .props = props,
      .listen = Thunks<StreamProvider>::listen,
      .close_listener = Thunks<StreamProvider>::close_listener,
      .connect = Thunks<StreamProvider>::connect,
      .conn_status = Thunks<StreamProvider>::conn_status,
      .accept = Thunks<StreamProvider>::accept,
      .close_conn = Thunks<StreamProvider>::close_conn,
      .send_msg = Thunks<StreamProvider>::send_msg,
      .recv_msg = Thunks<StreamProvider>::recv_msg,
      .reg_mem = Thunks<StreamProvider>::reg_mem,
      .dereg_mem = Thunks<StreamProvider>::dereg_mem,
      .pack_rkey = Thunks<StreamProvider>::pack_rkey,
      .put = Thunks<StreamProvider>::put,
      .test = Thunks<StreamProvider>::test,
      .progress = ops::progress,
      .mem_alloc = nullptr,  // no HMC_NET_CAP_MEM_ALLOC: host memory stays the cpu provider's
      .mem_free = nullptr,
      .get = nullptr,  // no HMC_NET_CAP_GET: the host puts every rendezvous
      .events = Thunks<StreamProvider>::events,
      .idle = Thunks<StreamProvider>::idle,
  };
}

}  // namespace hmc_net
