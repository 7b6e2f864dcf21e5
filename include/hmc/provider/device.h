/*
 * HMC device provider ABI, version 1.
 *
 * A device provider wraps one vendor runtime (or plain host memory). It is a
 * shared object `libhmc-device-<name>.so` exporting
 *
 *     const hmc_device_provider_t* hmc_device_provider_v1(void);
 *
 * The loader checks struct_size and abi_version before calling anything. A
 * function whose capability bit is clear may be NULL; the host never calls it.
 * Every function returns 0 on success and a negative HMC_PROV_ERR_* on failure;
 * `last_error` then describes the failure of the calling thread.
 *
 * Pointers are the vendor's own (unified virtual addresses where the runtime
 * has them). A `stream` of NULL means "synchronous, on the calling thread"; a
 * non-NULL stream may be one the application created with the vendor runtime
 * (a cudaStream_t, say), not only one from stream_create.
 *
 * Functions appended after the first release sit at the end of the table; the
 * loader reads one only when struct_size covers it and its capability bit is
 * set, so older providers keep loading.
 */
#ifndef HMC_PROVIDER_DEVICE_H
#define HMC_PROVIDER_DEVICE_H

#include "hmc/provider/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HMC_DEVICE_ABI_VERSION 1
#define HMC_DEVICE_ENTRY_V1 "hmc_device_provider_v1"

/* Capability bits. */
#define HMC_DEV_CAP_DEVICE_MEM (1ull << 0)  /* mem_alloc(HMC_ALLOC_DEVICE) */
#define HMC_DEV_CAP_PINNED_HOST (1ull << 1) /* mem_alloc(HMC_ALLOC_PINNED_HOST) */
#define HMC_DEV_CAP_SHAREABLE (1ull << 2)   /* memory another process can map (ipc_*) */
#define HMC_DEV_CAP_STREAMS (1ull << 3)     /* stream_* and event_* */
#define HMC_DEV_CAP_REDUCE (1ull << 4)      /* reduce and divide */
#define HMC_DEV_CAP_IPC (1ull << 5)         /* ipc_export/ipc_import/ipc_close */
#define HMC_DEV_CAP_DMABUF (1ull << 6)      /* dmabuf_export */
#define HMC_DEV_CAP_PEER_ACCESS (1ull << 7) /* peer_access */
#define HMC_DEV_CAP_STREAM_FLAGS (1ull << 8) /* flag_alloc/flag_free/stream_wait_flag (appended) */
#define HMC_DEV_CAP_HOST_REGISTER (1ull << 9) /* host_register/host_unregister (appended) */
#define HMC_DEV_CAP_MEM_QUERY (1ull << 10)    /* mem_query (appended) */
#define HMC_DEV_CAP_IPC_EXTENT (1ull << 11)   /* ipc_extent (appended) */

/* mem_alloc kinds. */
#define HMC_ALLOC_DEVICE 0
#define HMC_ALLOC_PINNED_HOST 1
#define HMC_ALLOC_SHAREABLE 2 /* IPC-exportable memory of the device's kind */

#define HMC_IPC_HANDLE_MAX 256

typedef struct hmc_device_info {
  size_t struct_size; /* set by the caller to sizeof(hmc_device_info_t) before device_info */
  char vendor[32];     /* "cpu", "nvidia", "amd", ... */
  char model[96];
  char pci_bus_id[32]; /* "0000:3b:00.0", empty when not a PCI device */
  int numa_node;       /* -1 when unknown */
  int mem_kind;        /* HMC_MEM_HOST or HMC_MEM_DEVICE */
  uint64_t memory_bytes;
} hmc_device_info_t;

typedef struct hmc_device_provider {
  size_t struct_size; /* sizeof(hmc_device_provider_t) of the provider's header */
  uint32_t abi_version;
  const char* name;   /* "cpu", "cuda", ... ; the file is libhmc-device-<name>.so */
  uint64_t caps;
  const hmc_param_t* params; /* the provider's HMC_* parameters */
  size_t num_params;

  /* Returns 0, or HMC_PROV_ERR_UNAVAILABLE with `reason` filled
   * ("no CUDA driver: libcuda.so.1 not found"), or HMC_PROV_ERR_INVALID with the
   * reason when one of its parameters is malformed. */
  int (*init)(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len);
  void (*fini)(void* state);
  const char* (*last_error)(void* state);

  int (*device_count)(void* state, int* count);
  int (*device_info)(void* state, int device, hmc_device_info_t* info);

  int (*mem_alloc)(void* state, int device, size_t bytes, int alloc_kind, void** ptr);
  int (*mem_free)(void* state, int device, void* ptr);
  /* Copy between any two pointers this provider understands (host included). */
  int (*copy)(void* state, void* dst, const void* src, size_t bytes, void* stream);

  int (*stream_create)(void* state, int device, void** stream);
  int (*stream_destroy)(void* state, void* stream);
  /* 0 when all work on the stream is done, 1 while some is pending. */
  int (*stream_query)(void* state, void* stream);
  int (*event_create)(void* state, int device, void** event);
  int (*event_destroy)(void* state, void* event);
  int (*event_record)(void* state, void* event, void* stream);
  int (*stream_wait_event)(void* state, void* stream, void* event);
  int (*event_query)(void* state, void* event); /* 0 done, 1 pending */

  /* dst[i] = a[i] op b[i] for i < count; dst may equal a or b, but buffers must
   * not otherwise overlap. min/max propagate NaN (IEEE 754-2019 minimum/maximum)
   * so that every vendor agrees in mixed all-reduces. HMC_OP_AVG
   * accumulates like HMC_OP_SUM; `divide` finishes an average. */
  int (*reduce)(void* state, void* dst, const void* a, const void* b, size_t count, int dtype,
                int op, void* stream);
  /* buf[i] = buf[i] / divisor (integers truncate toward zero). */
  int (*divide)(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream);

  /* Export [ptr, ptr + bytes) as an opaque handle another process of the same host
   * imports. The host asks for its device memory (of mem_alloc, or that mem_query
   * reported) and for mem_alloc(HMC_ALLOC_SHAREABLE) host memory, always naming a
   * whole allocation; memory the provider cannot export fails, and the host then moves
   * it through host memory instead. */
  int (*ipc_export)(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
                    size_t* handle_len);
  int (*ipc_import)(void* state, const void* handle, size_t handle_len, void** ptr);
  int (*ipc_close)(void* state, void* ptr);
  int (*dmabuf_export)(void* state, void* ptr, size_t bytes, int* fd, uint64_t* offset);
  int (*peer_access)(void* state, int device, int peer_device, int* can_access);

  /* Appended: stream-ordered completion (HMC_DEV_CAP_STREAM_FLAGS). A flag is a
   * 32-bit word in host memory that the device can read. The host sets it (a
   * release store) when an operation finishes; work queued on `stream` after
   * stream_wait_flag runs only once *flag >= value, without blocking any host
   * thread. */
  int (*flag_alloc)(void* state, int device, volatile uint32_t** flag);
  int (*flag_free)(void* state, volatile uint32_t* flag);
  int (*stream_wait_flag)(void* state, void* stream, volatile uint32_t* flag, uint32_t value);

  /* Appended: host memory registration (HMC_DEV_CAP_HOST_REGISTER). host_register
   * makes [ptr, ptr + bytes) of ordinary host memory (malloc'd, or a shared mapping
   * of another process's buffer) copy at the speed of pinned memory, as
   * cudaHostRegister does; copy() works on it with or without registration, so a
   * failure here only costs speed. The host registers a range once, never two
   * overlapping ranges, and calls host_unregister(ptr) with the same ptr before the
   * memory is freed or unmapped. */
  int (*host_register)(void* state, void* ptr, size_t bytes);
  int (*host_unregister)(void* state, void* ptr);

  /* Appended: memory the host did not allocate (HMC_DEV_CAP_MEM_QUERY). The host
   * knows the memory it allocated with mem_alloc; an application passes it others too
   * (its own cudaMalloc, a framework's pool). For a pointer the host does not know, it
   * asks: 0 when `ptr` lies in device memory of this provider that the CPU cannot
   * touch, whoever allocated it, with its device and the allocation holding it
   * ([*base, *base + *bytes)) and an *id that names that allocation in this process
   * and is never given to another one later, not even at the same address (CUDA's
   * buffer id), or 0 where the provider has none; 1 when it is not (host memory of any
   * kind, memory the CPU can also reach, an address nobody allocated); a negative code
   * when the query itself failed. The host then moves that memory with this provider's
   * copy, reduce and ipc_export, as its own device memory; it keeps an export by *id
   * (with id 0 it exports afresh for every message, as it cannot see the memory
   * freed). It asks on every send and receive of memory it does not know, host memory
   * included, so the answer must be cheap, and asking must not create a context on any
   * device. */
  int (*mem_query)(void* state, const void* ptr, int* device, void** base, size_t* bytes, uint64_t* id);

  /* Appended: what an import maps (HMC_DEV_CAP_IPC_EXTENT, with HMC_DEV_CAP_IPC). For a
   * pointer ipc_import returned, *bytes: how many bytes from it on the import maps, as the
   * provider knows it from the mapping itself (the file's size it checked, the driver's
   * range of the allocation), never from what the exporter wrote into the handle. The
   * exporting peer also says how large its memory is, and the host writes only where both
   * allow: without this entry a peer that lies in its first offer could make the host
   * write past the mapping. */
  int (*ipc_extent)(void* state, void* ptr, size_t* bytes);
} hmc_device_provider_t;

typedef const hmc_device_provider_t* (*hmc_device_entry_v1_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* HMC_PROVIDER_DEVICE_H */
