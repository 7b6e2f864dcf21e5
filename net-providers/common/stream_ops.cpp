#include "common/stream_ops.h"

namespace hmc_net::ops {

namespace {

template <class F>
int guarded(void* state, F&& fn) {
  return hmc_net::guarded<StreamProvider>(state, std::forward<F>(fn));
}

}  // namespace

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
  if (props == nullptr || props->struct_size < sizeof(hmc_net_props_t)) return HMC_PROV_ERR_INVALID;
  props->latency_us = latency_us;
  props->bandwidth_gbps = bandwidth_gbps;
  props->max_msg_size = kMaxMessage;
  return HMC_PROV_OK;
}

int listen(void* state, const char* host_hint, void* addr, size_t addr_cap, size_t* addr_len,
           void** listener) {
  return guarded(state, [&](StreamProvider& p) {
    return p.listen(host_hint, addr, addr_cap, addr_len, listener);
  });
}

int close_listener(void* state, void* listener) {
  return guarded(state, [&](StreamProvider& p) { return p.close_listener(listener); });
}

int connect(void* state, const void* addr, size_t addr_len, const void* hello, size_t hello_len,
            void** conn) {
  return guarded(
      state, [&](StreamProvider& p) { return p.connect(addr, addr_len, hello, hello_len, conn); });
}

int conn_status(void* state, void* conn) {
  return guarded(state, [&](StreamProvider& p) { return p.conn_status(conn); });
}

int accept(void* state, void* listener, void** conn, void* hello, size_t hello_cap,
           size_t* hello_len) {
  return guarded(state, [&](StreamProvider& p) {
    return p.accept(listener, conn, hello, hello_cap, hello_len);
  });
}

int close_conn(void* state, void* conn) {
  return guarded(state, [&](StreamProvider& p) { return p.close_conn(conn); });
}

int send_msg(void* state, void* conn, const void* buf, size_t len, void** req) {
  return guarded(state, [&](StreamProvider& p) { return p.send_msg(conn, buf, len, req); });
}

int recv_msg(void* state, void* conn, void* buf, size_t cap, void** req) {
  return guarded(state, [&](StreamProvider& p) { return p.recv_msg(conn, buf, cap, req); });
}

int reg_mem(void* state, void* ptr, size_t bytes, int mem_kind, void** mr) {
  return guarded(state, [&](StreamProvider& p) { return p.reg_mem(ptr, bytes, mem_kind, mr); });
}

int dereg_mem(void* state, void* mr) {
  return guarded(state, [&](StreamProvider& p) { return p.dereg_mem(mr); });
}

int pack_rkey(void* state, void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len) {
  return guarded(state,
                 [&](StreamProvider& p) { return p.pack_rkey(mr, rkey, rkey_cap, rkey_len); });
}

int put(void* state, void* conn, const void* src, size_t len, void* /*local_mr*/, const void* rkey,
        size_t rkey_len, uint64_t offset, void** req) {
  return guarded(
      state, [&](StreamProvider& p) { return p.put(conn, src, len, rkey, rkey_len, offset, req); });
}

int test(void* state, void* req, int* done, size_t* bytes, char* message, size_t message_cap) {
  return guarded(state,
                 [&](StreamProvider& p) { return p.test(req, done, bytes, message, message_cap); });
}

int progress(void* state) {
  // The io thread makes progress; nothing to do on the host's thread.
  return state == nullptr ? HMC_PROV_ERR_INVALID : HMC_PROV_OK;
}

}  // namespace hmc_net::ops
