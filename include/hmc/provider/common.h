/*
 * HMC provider ABI: definitions shared by device and net providers.
 *
 * This header is C. Within an ABI version structs and tables grow only at their
 * end, each reader going by the struct_size it is given (docs/provider-guide.md);
 * the loader requires the exact version, so a bump breaks every older provider and
 * is kept for changes that cannot be appended. Nothing here may depend on C++.
 *
 * Return codes: 0 ok, 1 in progress, negative errors (HMC_PROV_ERR_*).
 */
#ifndef HMC_PROVIDER_COMMON_H
#define HMC_PROVIDER_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HMC_PROV_OK 0
#define HMC_PROV_IN_PROGRESS 1
#define HMC_PROV_ERR_INTERNAL (-1)
#define HMC_PROV_ERR_INVALID (-2)       /* bad argument */
#define HMC_PROV_ERR_UNSUPPORTED (-3)   /* capability bit clear */
#define HMC_PROV_ERR_UNAVAILABLE (-4)   /* runtime, driver or device missing */
#define HMC_PROV_ERR_NO_MEMORY (-5)
#define HMC_PROV_ERR_PEER_LOST (-6)     /* connection closed or reset */
#define HMC_PROV_ERR_REFUSED (-7)       /* connection refused or not authenticated */
#define HMC_PROV_ERR_OUT_OF_BOUNDS (-8) /* write outside a registered region */
#define HMC_PROV_ERR_TRUNCATED (-9)     /* message larger than the posted buffer */
#define HMC_PROV_ERR_CLOSED (-10)       /* object already closed */

/* Log levels passed to the host's log callback (same order as spdlog). */
#define HMC_LOG_TRACE 0
#define HMC_LOG_DEBUG 1
#define HMC_LOG_INFO 2
#define HMC_LOG_WARN 3
#define HMC_LOG_ERROR 4

/* Services the host (libhmc) lends to a provider at init. Valid until fini. */
typedef struct hmc_host_services {
  size_t struct_size;
  void* host;
  /* Log one message; `provider` names the subsystem (the provider's name). */
  void (*log)(void* host, int level, const char* provider, const char* message);
  /* Look a provider parameter up by full name (e.g. "HMC_TCP_SOCKBUF").
   * Returns 0 and copies the value (NUL-terminated): the one set, else the
   * default of the parameter's table; 1 when neither (unset, no default);
   * negative when the buffer is too small. Providers register their
   * parameters in their own table (see device.h/net.h `params`). */
  int (*config_get)(void* host, const char* name, char* value, size_t value_len);
  /* Wake the host's waiters: call after a request completed on a provider
   * thread so that a blocked wait() looks again. Cheap, may be called often. */
  void (*wake)(void* host);
} hmc_host_services_t;

/* One tunable parameter a provider reads through config_get. */
typedef struct hmc_param {
  const char* name;          /* "HMC_TCP_SOCKBUF" */
  const char* type;          /* "size", "int", "bool", "duration", "list", "string" */
  const char* default_value; /* as text */
  const char* help;
} hmc_param_t;

/* Memory kinds, used by both device and net providers. */
#define HMC_MEM_HOST 0
#define HMC_MEM_DEVICE 1

/* Data types and reduce operations, in the same order as hmc::DataType and
 * hmc::ReduceOp in include/hmc/types.h. */
#define HMC_DTYPE_INT8 0
#define HMC_DTYPE_UINT8 1
#define HMC_DTYPE_INT32 2
#define HMC_DTYPE_UINT32 3
#define HMC_DTYPE_INT64 4
#define HMC_DTYPE_UINT64 5
#define HMC_DTYPE_FP16 6
#define HMC_DTYPE_BF16 7
#define HMC_DTYPE_FP32 8
#define HMC_DTYPE_FP64 9
#define HMC_DTYPE_COUNT 10

#define HMC_OP_SUM 0
#define HMC_OP_PROD 1
#define HMC_OP_MIN 2
#define HMC_OP_MAX 3
#define HMC_OP_AVG 4
#define HMC_OP_COUNT 5

#ifdef __cplusplus
}
#endif
#endif /* HMC_PROVIDER_COMMON_H */
