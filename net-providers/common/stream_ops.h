// The C ABI side of a stream provider: thunks that turn `void* state` into a
// StreamProvider and make sure no exception crosses into the host.
//
// A transport's table points at these for everything but init and props:
//   .init = hmc_net::init<TcpProvider>, .listen = hmc_net::ops::listen, ...
#pragma once

#include <memory>
#include <new>
#include <string>

#include "common/stream_provider.h"

namespace hmc_net {

namespace ops {
void fini(void* state);
int fill_props(void* state, hmc_net_props_t* props, double latency_us, double bandwidth_gbps);
int listen(void* state, const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len,
           void** listener);
int close_listener(void* state, void* listener);
int connect(void* state, const void* addr, size_t addr_len, const void* hello, size_t hello_len,
            void** conn);
int conn_status(void* state, void* conn);
int accept(void* state, void* listener, void** conn, void* hello, size_t hello_cap,
           size_t* hello_len);
int close_conn(void* state, void* conn);
int send_msg(void* state, void* conn, const void* buf, size_t len, void** req);
int recv_msg(void* state, void* conn, void* buf, size_t cap, void** req);
int reg_mem(void* state, void* ptr, size_t bytes, int mem_kind, void** mr);
int dereg_mem(void* state, void* mr);
int pack_rkey(void* state, void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len);
int put(void* state, void* conn, const void* src, size_t len, void* local_mr, const void* rkey,
        size_t rkey_len, uint64_t offset, void** req);
int test(void* state, void* req, int* done, size_t* bytes, char* message, size_t message_cap);
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
      .listen = ops::listen,
      .close_listener = ops::close_listener,
      .connect = ops::connect,
      .conn_status = ops::conn_status,
      .accept = ops::accept,
      .close_conn = ops::close_conn,
      .send_msg = ops::send_msg,
      .recv_msg = ops::recv_msg,
      .reg_mem = ops::reg_mem,
      .dereg_mem = ops::dereg_mem,
      .pack_rkey = ops::pack_rkey,
      .put = ops::put,
      .test = ops::test,
      .progress = ops::progress,
  };
}

}  // namespace hmc_net
