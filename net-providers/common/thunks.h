// The C ABI entry points of a net provider class P, one per method: each turns `void*
// state` into P& and lets no exception cross into the host (hmc_net::guarded). The
// stream providers (tcp, shm) and ucx point their tables at Thunks<their class>.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host.h"

namespace hmc_net {

template <class P>
struct Thunks {
  static int listen(void* s, const char* hint, void* addr, size_t cap, size_t* len, void** listener) {
    return guarded<P>(s, [&](P& p) { return p.listen(hint, addr, cap, len, listener); });
  }
  static int close_listener(void* s, void* listener) {
    return guarded<P>(s, [&](P& p) { return p.close_listener(listener); });
  }
  static int connect(void* s, const void* addr, size_t len, const void* hello, size_t hello_len, void** conn) {
    return guarded<P>(s, [&](P& p) { return p.connect(addr, len, hello, hello_len, conn); });
  }
  static int conn_status(void* s, void* conn) {
    return guarded<P>(s, [&](P& p) { return p.conn_status(conn); });
  }
  static int accept(void* s, void* listener, void** conn, void* hello, size_t cap, size_t* len) {
    return guarded<P>(s, [&](P& p) { return p.accept(listener, conn, hello, cap, len); });
  }
  static int close_conn(void* s, void* conn) {
    return guarded<P>(s, [&](P& p) { return p.close_conn(conn); });
  }
  static int send_msg(void* s, void* conn, const void* buf, size_t len, void** req) {
    return guarded<P>(s, [&](P& p) { return p.send_msg(conn, buf, len, req); });
  }
  static int recv_msg(void* s, void* conn, void* buf, size_t cap, void** req) {
    return guarded<P>(s, [&](P& p) { return p.recv_msg(conn, buf, cap, req); });
  }
  static int reg_mem(void* s, void* ptr, size_t bytes, int kind, void** mr) {
    return guarded<P>(s, [&](P& p) { return p.reg_mem(ptr, bytes, kind, mr); });
  }
  static int dereg_mem(void* s, void* mr) {
    return guarded<P>(s, [&](P& p) { return p.dereg_mem(mr); });
  }
  static int pack_rkey(void* s, void* mr, void* rkey, size_t cap, size_t* len) {
    return guarded<P>(s, [&](P& p) { return p.pack_rkey(mr, rkey, cap, len); });
  }
  // local_mr is unused: these providers need no source (or destination) registration.
  static int put(void* s, void* conn, const void* src, size_t len, void* /*local_mr*/, const void* rkey,
                 size_t rkey_len, uint64_t offset, void** req) {
    return guarded<P>(s, [&](P& p) { return p.put(conn, src, len, rkey, rkey_len, offset, req); });
  }
  static int get(void* s, void* conn, void* dst, size_t len, void* /*local_mr*/, const void* rkey,
                 size_t rkey_len, uint64_t offset, void** req) {
    return guarded<P>(s, [&](P& p) { return p.get(conn, dst, len, rkey, rkey_len, offset, req); });
  }
  static int test(void* s, void* req, int* done, size_t* bytes, char* msg, size_t cap) {
    return guarded<P>(s, [&](P& p) { return p.test(req, done, bytes, msg, cap); });
  }
  static uint64_t events(void* s) noexcept { return static_cast<P*>(s)->events(); }
  static void idle(void* s) noexcept { static_cast<P*>(s)->idle(); }
};

}  // namespace hmc_net
