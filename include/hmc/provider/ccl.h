/*
 * HMC collective provider ABI, version 1.
 *
 * A collective provider hands a vendor's collective library (NCCL, RCCL, ...) to
 * HMC, which delegates to it the collectives of a communicator whose ranks all sit on
 * devices of one device provider (DESIGN.md: homogeneous groups may delegate to the
 * vendor CCL). It is a shared object `libhmc-ccl-<name>.so` exporting
 *
 *     const hmc_ccl_provider_t* hmc_ccl_provider_v1(void);
 *
 * Buffers are memory of `device_provider` on the communicator's device; core stages
 * anything else. Every operation is queued on a stream of that provider (never NULL)
 * and returns once queued; core learns of completion through the stream. Every
 * function returns 0 on success and a negative HMC_PROV_ERR_* on failure, with
 * `last_error` describing the failure of the calling thread.
 *
 * dtypes are HMC_DTYPE_*; ops HMC_OP_SUM, PROD, MIN, MAX (core builds avg from a sum
 * and the device provider's divide, so that avg keeps HMC's rounding).
 */
#ifndef HMC_PROVIDER_CCL_H
#define HMC_PROVIDER_CCL_H

#include "hmc/provider/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HMC_CCL_ABI_VERSION 1
#define HMC_CCL_ENTRY_V1 "hmc_ccl_provider_v1"
#define HMC_CCL_ID_MAX 256

/* Capability bits. */
#define HMC_CCL_CAP_SHARED_DEVICE (1ull << 0) /* ranks may share a device (NCCL: no) */

typedef struct hmc_ccl_provider {
  size_t struct_size; /* sizeof(hmc_ccl_provider_t) of the provider's header */
  uint32_t abi_version;
  const char* name; /* "nccl", ... ; the file is libhmc-ccl-<name>.so */
  uint64_t caps;    /* HMC_CCL_CAP_* */
  const hmc_param_t* params;
  size_t num_params;
  const char* device_provider; /* whose memory and streams it works on: "cuda" */

  /* 0, or HMC_PROV_ERR_UNAVAILABLE with `reason` ("libnccl.so.2 not found"). */
  int (*init)(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len);
  void (*fini)(void* state);
  const char* (*last_error)(void* state);

  /* 1 when dtype x op runs here with HMC's results, else 0. */
  int (*supports)(void* state, int dtype, int op);

  /* A fresh communicator id (called on one rank, given to all). */
  int (*unique_id)(void* state, void* id, size_t cap, size_t* len);
  /* Joins communicator `id` as `rank` of `nranks` on `device`. Collective: every rank
   * calls it. Fails instead of waiting past `timeout_ms` for the others. */
  int (*comm_init)(void* state, const void* id, size_t id_len, int nranks, int rank, int device,
                   int64_t timeout_ms, void** comm);
  int (*comm_destroy)(void* state, void* comm);
  /* Ends the communicator at once; queued and running operations are cut short. */
  int (*comm_abort)(void* state, void* comm);
  /* 0 while healthy; the error (and last_error) once the communicator failed. */
  int (*comm_status)(void* state, void* comm);

  int (*all_reduce)(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                    void* stream);
  int (*broadcast)(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int root,
                   void* stream);
  int (*reduce)(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, int root,
                void* stream);
  /* count: elements per rank. */
  int (*all_gather)(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, void* stream);
  int (*reduce_scatter)(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                        void* stream);
  /* Point-to-point, matched in order per peer; between group_start and group_end the
   * calls of one rank run together (an all-to-all is one group). */
  int (*send)(void* state, void* comm, const void* buf, size_t count, int dtype, int peer, void* stream);
  int (*recv)(void* state, void* comm, void* buf, size_t count, int dtype, int peer, void* stream);
  int (*group_start)(void* state);
  int (*group_end)(void* state, void* comm);
} hmc_ccl_provider_t;

typedef const hmc_ccl_provider_t* (*hmc_ccl_entry_v1_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* HMC_PROVIDER_CCL_H */
