/*
 * HMC net provider ABI, version 1.
 *
 * A net provider moves bytes between processes: tcp, shm (same host), ucx,
 * verbs. It is a shared object `libhmc-net-<name>.so` exporting
 *
 *     const hmc_net_provider_t* hmc_net_provider_v1(void);
 *
 * Model. A provider listens once and publishes an opaque address (carried to
 * peers in the capability card). A connection is bidirectional and carries:
 *   - messages (send_msg/recv_msg): delivered whole and in posting order; a
 *     receive completes with the length of the message it got;
 *   - puts: one-sided writes into memory the peer registered (reg_mem) and
 *     described by a packed remote key. The target never posts anything.
 *   - gets (optional, HMC_NET_CAP_GET): one-sided reads of such memory.
 * Ordering contract: a message sent after a put on the same connection is
 * delivered after the put's data is visible in the target's memory. The host
 * builds tag matching, rendezvous and put notifications on this.
 *
 * Nothing blocks: connect/accept return at once, data calls return a request
 * that `test` polls. Providers that need the host's thread to advance call it
 * from `progress`; providers with threads of their own call host->wake after
 * completing a request. `test` releases the request once it reports done or an
 * error. `close_conn` fails every pending request of that connection; a call
 * that names the connection after it (one that raced it on another thread) fails
 * with HMC_PROV_ERR_CLOSED.
 */
#ifndef HMC_PROVIDER_NET_H
#define HMC_PROVIDER_NET_H

#include "hmc/provider/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HMC_NET_ABI_VERSION 1
#define HMC_NET_ENTRY_V1 "hmc_net_provider_v1"

/* Capability bits. */
#define HMC_NET_CAP_MSG (1ull << 0)          /* send_msg/recv_msg */
#define HMC_NET_CAP_PUT (1ull << 1)          /* reg_mem/put */
#define HMC_NET_CAP_REMOTE (1ull << 2)       /* reaches other hosts */
#define HMC_NET_CAP_SAME_HOST (1ull << 3)    /* reaches processes of this host */
#define HMC_NET_CAP_MEM_HOST (1ull << 4)     /* touches host memory */
#define HMC_NET_CAP_MEM_DMABUF (1ull << 5)   /* touches device memory through dma-buf */
#define HMC_NET_CAP_MEM_PEER (1ull << 6)     /* touches device memory through peer memory */
#define HMC_NET_CAP_SINGLE_COPY (1ull << 7)  /* put copies once (no staging in between) */
#define HMC_NET_CAP_MEM_ALLOC (1ull << 8)    /* mem_alloc/mem_free (appended to the table) */
#define HMC_NET_CAP_GET (1ull << 9)          /* get (appended to the table) */
/* Moves everything within the host's calls (progress, test, the data calls): no thread
 * of its own needs a CPU while the host polls. The host's waiters then yield the CPU less
 * often where the host has one for each rank (core/progress.h); without the bit they
 * leave room for the provider's threads. A hint: no entry point behind it. */
#define HMC_NET_CAP_POLLED (1ull << 10)

#define HMC_NET_ADDR_MAX 128
#define HMC_NET_HELLO_MAX 256
#define HMC_NET_RKEY_MAX 256

typedef struct hmc_net_props {
  size_t struct_size;
  double latency_us;     /* small message, one way, estimate for the cost model */
  double bandwidth_gbps; /* large transfers, 1e9 bytes/s, estimate for the cost model */
  size_t max_msg_size;   /* largest send_msg */
  /* Appended to ABI v1. The host fills struct_size and zeroes the struct; a
   * provider accepts any struct_size from HMC_NET_PROPS_V1_SIZE up and writes a
   * field only when struct_size covers it, so older hosts and providers mix.
   *
   * Protocol advice per pair class: messages larger than this go faster as a
   * rendezvous (the receiver's buffer registered, the data put into it) than
   * inside one send_msg, for peers on this host / on other hosts. 0: no advice
   * (the host's HMC_EAGER_LIMIT). The host never sends eagerly above its own
   * limit, whatever the advice. */
  size_t eager_limit_same_host;
  size_t eager_limit_remote;
  /* Appended to ABI v1. Capability bits of the table's `caps` that this
   * instance lacks as configured; the host clears them before it tells peers
   * what the provider can do. ucx under UCX_TLS=shm withdraws
   * HMC_NET_CAP_REMOTE: its transports reach no other host. A provider that
   * withdraws HMC_NET_CAP_MSG is unavailable. */
  uint64_t caps_absent;
  /* Appended to ABI v1. Protocol advice per pair class for providers with
   * HMC_NET_CAP_GET: rendezvous messages up to this size go faster with the
   * receiver getting the data from the sender's registered buffer (one message
   * each way) than with the sender putting it after the receiver's CTS (three
   * messages), for peers on this host / on other hosts. 0: the host puts
   * (HMC_RNDV); SIZE_MAX: gets at every size. */
  size_t rndv_get_max_same_host;
  size_t rndv_get_max_remote;
  /* Appended to ABI v1. A second band of that advice: rendezvous messages of at
   * least this size go by get as well, those between rndv_get_max_* and it by
   * put (a put can keep both buffers in the sender's cache there). 0: no second
   * band. Read only where rndv_get_max_* of the same pair class is not 0. */
  size_t rndv_get_from_same_host;
  size_t rndv_get_from_remote;
} hmc_net_props_t;

/* The size of hmc_net_props_t before anything was appended to it. */
#define HMC_NET_PROPS_V1_SIZE (offsetof(hmc_net_props_t, max_msg_size) + sizeof(size_t))

typedef struct hmc_net_provider {
  size_t struct_size;
  uint32_t abi_version;
  const char* name; /* "tcp", "shm", ... ; the file is libhmc-net-<name>.so */
  uint64_t caps;
  const hmc_param_t* params;
  size_t num_params;

  int (*init)(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len);
  void (*fini)(void* state);
  int (*props)(void* state, hmc_net_props_t* props);

  /* Start listening. `host_hint` is the local address the control plane uses
   * (an IP string, may be empty). Writes the address peers connect to. */
  int (*listen)(void* state, const char* host_hint, void* addr, size_t addr_cap,
                size_t* addr_len, void** listener);
  int (*close_listener)(void* state, void* listener);
  /* Start connecting; returns the connection at once. `hello` is delivered to
   * the acceptor before anything else (the host uses it to authenticate). */
  int (*connect)(void* state, const void* addr, size_t addr_len, const void* hello,
                 size_t hello_len, void** conn);
  /* 0 connected, 1 still connecting, negative failed. */
  int (*conn_status)(void* state, void* conn);
  /* 0 with *conn and hello filled when a peer's hello came, 1 when none waits.
   * The hello is all the host has checked: the host then either refuses the
   * connection (close_conn) or keeps it and calls conn_status until it leaves 1.
   * That first conn_status call is the host's word that the peer is genuine: a
   * provider must not hand anything else the peer sent (addresses, keys) to code
   * that trusts it before then (ucx creates its UCX endpoint only then), and may
   * report 1 until its own setup is done. Data calls wait for conn_status 0 (a
   * provider may take a first send or receive as the same word, for hosts that
   * never ask). Connections the host does not take may be dropped after a while. */
  int (*accept)(void* state, void* listener, void** conn, void* hello, size_t hello_cap,
                size_t* hello_len);
  int (*close_conn)(void* state, void* conn);

  int (*send_msg)(void* state, void* conn, const void* buf, size_t len, void** req);
  int (*recv_msg)(void* state, void* conn, void* buf, size_t cap, void** req);

  /* Register memory as a put target; pack its remote key for peers. Once
   * dereg_mem returns, no byte of any peer's put lands in the region: a put
   * already under way finishes or stops first, and later ones with its key fail
   * with HMC_PROV_ERR_OUT_OF_BOUNDS (the host may free the memory then).
   * Ranges of mem_alloc memory are exempt: peers may write it directly. */
  int (*reg_mem)(void* state, void* ptr, size_t bytes, int mem_kind, void** mr);
  int (*dereg_mem)(void* state, void* mr);
  int (*pack_rkey)(void* state, void* mr, void* rkey, size_t rkey_cap, size_t* rkey_len);
  /* Write `len` bytes from `src` to offset `offset` of the peer region `rkey`
   * names. `local_mr` may be NULL when the provider needs no source
   * registration. Fails with HMC_PROV_ERR_OUT_OF_BOUNDS past the region, and with
   * HMC_PROV_ERR_PEER_LOST where the peer closed the connection, even if its region is
   * gone too (a host closes its connections before it releases its regions). */
  int (*put)(void* state, void* conn, const void* src, size_t len, void* local_mr,
             const void* rkey, size_t rkey_len, uint64_t offset, void** req);

  /* 0 and *done=0 while pending; 0 and *done=1 when complete (bytes set);
   * negative on failure with `message` filled. Done or failed releases req. */
  int (*test)(void* state, void* req, int* done, size_t* bytes, char* message,
              size_t message_cap);
  int (*progress)(void* state);

  /* Appended to ABI v1 (the host reads them only from a table whose struct_size
   * holds them, and only with HMC_NET_CAP_MEM_ALLOC set).
   *
   * Host memory the provider allocates so that puts into it and out of it take
   * the provider's fastest path (ucx: ucp_mem_map with ALLOCATE, a shared-memory
   * segment its peers map and memcpy into). The memory comes back registered:
   * `mr` is a registration as reg_mem makes, valid with pack_rkey and as put's
   * local_mr; the host never passes it to dereg_mem. reg_mem of any range inside
   * the memory must reuse this registration, not register the memory again.
   * mem_free releases the memory and `mr`; registrations of ranges inside it
   * that the host has not deregistered yet stay valid (and keep the pages) until
   * it does. */
  int (*mem_alloc)(void* state, size_t bytes, void** ptr, void** mr);
  int (*mem_free)(void* state, void* ptr, void* mr);

  /* Appended to ABI v1 (read only from a table whose struct_size holds it, and
   * only with HMC_NET_CAP_GET set).
   *
   * Read `len` bytes at offset `offset` of the peer region `rkey` names into
   * `dst` (host memory of this process; `local_mr` as for put). The request
   * completes once the bytes are in `dst`; the peer posts nothing. Fails with
   * HMC_PROV_ERR_OUT_OF_BOUNDS past the region (no byte read), and with
   * HMC_PROV_ERR_INVALID, at once or on the first get with a key, where this
   * provider cannot read that region directly: the host then asks the peer to
   * put instead. Bytes the peer changes while the get runs arrive either way. */
  int (*get)(void* state, void* conn, void* dst, size_t len, void* local_mr, const void* rkey,
             size_t rkey_len, uint64_t offset, void** req);

  /* Appended to ABI v1 (read only from a table whose struct_size holds it; may
   * be NULL).
   *
   * How many of this state's requests have ended (completed or failed) so far:
   * a count that only grows, moved after each end is visible to `test` (a
   * release, as the host reads it with an acquire). It lets the host skip
   * testing its requests in a progress pass while the count stands where it
   * stood before it last tested them all: the cost of a pass then no longer
   * grows with the number of connections. A provider whose requests can end
   * without moving the count must leave this NULL; the host then tests every
   * request in every pass. Called from any thread, often: no lock. */
  uint64_t (*events)(void* state);

  /* Appended to ABI v1 (read only from a table whose struct_size holds it; may
   * be NULL).
   *
   * The host is about to stop calling `progress`: a waiter that found nothing
   * goes to sleep. A provider that takes `progress` calls close together as a
   * host that polls, and then leaves what arrives for the next call instead of
   * calling host->wake, must stop taking it so at once: from this call on it
   * announces every request end with host->wake until calls come close together
   * again. The host makes one more `progress` call right after this one (to find
   * what came before), which must not count as close to the call before it.
   * With NULL the host cannot say so: its waiter sleeps at most 200 us first and
   * polls once more before a longer sleep, so what such a provider holds back
   * waits up to that long. Called from any thread, possibly while another thread
   * is inside `progress`. */
  void (*idle)(void* state);
} hmc_net_provider_t;

typedef const hmc_net_provider_t* (*hmc_net_entry_v1_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* HMC_PROVIDER_NET_H */
