#include "common/stream_ops.h"

namespace hmc_net::ops {

void fini(void* state) {
  if (state == nullptr) return;
  auto* p = static_cast<StreamProvider*>(state);
  try {
    p->shutdown();
  } catch (...) {
  }
  delete p;
}

int fill_props(void* state, hmc_net_props_t* props, double latency_us, double bandwidth_gbps) {
  if (props == nullptr || props->struct_size < HMC_NET_PROPS_V1_SIZE) return HMC_PROV_ERR_INVALID;
  props->latency_us = latency_us;  // eager-limit advice is the transport's (shm_provider.cpp)
  props->bandwidth_gbps = bandwidth_gbps;
  props->max_msg_size = kMaxMessage;
  return HMC_PROV_OK;
}

int progress(void* state) {
  // The io thread moves the sockets; the host's threads read the message rings.
  return guarded<StreamProvider>(state, [](StreamProvider& p) { return p.progress(); });
}

}  // namespace hmc_net::ops
