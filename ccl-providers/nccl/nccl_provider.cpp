// The nccl collective provider: NCCL behind HMC's collective provider ABI
// (include/hmc/provider/ccl.h), for communicators whose ranks all hold CUDA devices.
//
// libnccl.so.2 is opened at init (HMC_NCCL_LIBRARY), never linked, so the plugin builds
// wherever nccl.h is and loads anywhere: without a CUDA driver or without NCCL it says
// "unavailable: <why>". The CUDA runtime is static (as in the cuda device provider) and
// only sets the current device around NCCL calls.
//
// Communicators are blocking ones (a non-blocking communicator hands every call to a
// helper thread: measured 60-600 us per small all_reduce on 2x H200, against NCCL's 13 us).
// Init, the one call that waits for the other ranks, runs on a thread of its own, so that
// a rank that never joins fails the caller at the deadline; the late communicator, if it
// ever comes, is aborted by that thread.
#include <cuda.h>  // driver-API types only: reached through the runtime's entry points
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "hmc/provider/ccl.h"

namespace {

thread_local std::string g_error;

int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int fail(int code, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_error = buf;
  return code;
}

// The NCCL functions used, resolved from the library at init.
struct Nccl {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

struct State {
  hmc_host_services_t host{};
  void* lib = nullptr;
  Nccl f;
  int version = 0;
  bool pinned = false;  // an init thread was given up on: libnccl stays loaded (pin_code)
};

struct Comm {
  ncclComm_t nc = nullptr;
  int device = 0;
  int64_t timeout_ms = 0;
};

const hmc_param_t kParams[] = {
    {"HMC_NCCL_LIBRARY", "string", "libnccl.so.2", "the NCCL library the nccl collective provider opens"},
};

// HMC dtype -> NCCL dtype (HMC_DTYPE_* order).
constexpr ncclDataType_t kDtype[HMC_DTYPE_COUNT] = {ncclInt8,  ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                                    ncclUint64, ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64};

bool map_op(int op, ncclRedOp_t* out) {
  switch (op) {
    case HMC_OP_SUM: *out = ncclSum; return true;
    case HMC_OP_PROD: *out = ncclProd; return true;
    case HMC_OP_MIN: *out = ncclMin; return true;
    case HMC_OP_MAX: *out = ncclMax; return true;
    default: return false;
  }
}

// The calling thread's context, for DeviceScope; found at init (missing: it restores the
// device number instead).
PFN_cuCtxGetCurrent_v4000 g_ctx_get_current = nullptr;
PFN_cuCtxSetCurrent_v4000 g_ctx_set_current = nullptr;

// Makes `device` current for the scope and restores the caller's context, none included:
// cudaSetDevice of the device a thread without a context reports (0) would make a context
// on GPU 0 (as the cuda provider's DeviceGuard says).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device && g_ctx_get_current != nullptr)
      have_ctx_ = g_ctx_get_current(&previous_ctx_) == CUDA_SUCCESS;
    ok_ = previous_ == device || cudaSetDevice(device) == cudaSuccess;
    changed_ = ok_ && previous_ != device && (previous_ >= 0 || have_ctx_);
  }
  ~DeviceScope() {
    if (!changed_) return;
    if (have_ctx_) g_ctx_set_current(previous_ctx_);
    else cudaSetDevice(previous_);
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = -1;
  CUcontext previous_ctx_ = nullptr;
  bool have_ctx_ = false;
  bool ok_ = false;
  bool changed_ = false;
};

int nccl_fail(const State* s, ncclComm_t nc, ncclResult_t r, const char* what) {
  const char* detail = nc != nullptr && s->f.last_error != nullptr ? s->f.last_error(nc) : "";
  return fail(r == ncclInvalidArgument || r == ncclInvalidUsage ? HMC_PROV_ERR_INVALID : HMC_PROV_ERR_INTERNAL,
              "%s: %s%s%s", what, s->f.error_string(r), detail && *detail ? ": " : "", detail ? detail : "");
}

// Waits, up to the communicator's deadline, until a call that returned ncclInProgress
// has been taken up (the communicator leaves the in-progress state).
int settle(const State* s, Comm* c, ncclResult_t r, const char* what) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(c->timeout_ms);
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > until) {
      s->f.comm_abort(c->nc);
      c->nc = nullptr;
      return fail(HMC_PROV_ERR_PEER_LOST, "%s: not done after %lld ms (a rank missing?); communicator aborted", what,
                  static_cast<long long>(c->timeout_ms));
    }
    std::this_thread::yield();
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t q = s->f.async_error(c->nc, &state); q != ncclSuccess) return nccl_fail(s, c->nc, q, what);
    r = state;
  }
  return r == ncclSuccess ? HMC_PROV_OK : nccl_fail(s, c->nc, r, what);
}

template <class F>
bool resolve(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  auto* s = new State();
  s->host = *host;
  auto refuse = [&](const std::string& why) {
    std::snprintf(reason, reason_len, "%s", why.c_str());
    if (s->lib != nullptr) dlclose(s->lib);
    delete s;
    return HMC_PROV_ERR_UNAVAILABLE;
  };
  // The driver first, for a clear reason where there is none (as the cuda provider says).
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return refuse("no CUDA driver: libcuda.so.1 not found");
  dlclose(driver);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    cudaGetLastError();
    return refuse(std::string("no CUDA device: cudaGetDeviceCount: ") +
                  (err != cudaSuccess ? cudaGetErrorString(err) : "no device found"));
  }
  char lib[4096] = "libnccl.so.2";  // PATH_MAX
  const int got = host->config_get != nullptr ? host->config_get(host->host, "HMC_NCCL_LIBRARY", lib, sizeof(lib)) : 1;
  if (got < 0) {  // set on purpose, and not what was meant: not the system's library instead
    refuse("HMC_NCCL_LIBRARY is longer than a path (" + std::to_string(sizeof(lib) - 1) + " bytes)");
    return HMC_PROV_ERR_INVALID;
  }
  if (got != 0) std::snprintf(lib, sizeof(lib), "libnccl.so.2");
  s->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (s->lib == nullptr) {
    const char* why = dlerror();
    return refuse(std::string("no NCCL: ") + (why != nullptr ? why : lib));
  }
  void* get = nullptr;
  void* set = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess &&
      cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess && get != nullptr && set != nullptr) {
    g_ctx_get_current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
    g_ctx_set_current = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
  }
  cudaGetLastError();
  std::string missing;
  Nccl& f = s->f;
  resolve(s->lib, "ncclGetVersion", &f.get_version, &missing);
  resolve(s->lib, "ncclGetErrorString", &f.error_string, &missing);
  resolve(s->lib, "ncclGetLastError", &f.last_error, &missing);
  resolve(s->lib, "ncclGetUniqueId", &f.get_unique_id, &missing);
  resolve(s->lib, "ncclCommInitRank", &f.comm_init, &missing);
  resolve(s->lib, "ncclCommDestroy", &f.comm_destroy, &missing);
  resolve(s->lib, "ncclCommAbort", &f.comm_abort, &missing);
  resolve(s->lib, "ncclCommGetAsyncError", &f.async_error, &missing);
  resolve(s->lib, "ncclAllReduce", &f.all_reduce, &missing);
  resolve(s->lib, "ncclBroadcast", &f.broadcast, &missing);
  resolve(s->lib, "ncclReduce", &f.reduce, &missing);
  resolve(s->lib, "ncclAllGather", &f.all_gather, &missing);
  resolve(s->lib, "ncclReduceScatter", &f.reduce_scatter, &missing);
  resolve(s->lib, "ncclSend", &f.send, &missing);
  resolve(s->lib, "ncclRecv", &f.recv, &missing);
  resolve(s->lib, "ncclGroupStart", &f.group_start, &missing);
  resolve(s->lib, "ncclGroupEnd", &f.group_end, &missing);
  if (!missing.empty()) return refuse(std::string(lib) + " lacks " + missing + " (NCCL 2.14 or newer needed)");
  if (f.get_version(&s->version) != ncclSuccess || s->version < 21400)
    return refuse(std::string(lib) + ": NCCL " + std::to_string(s->version) + " is older than 2.14");
  if (host->log != nullptr) {
    char line[128];
    std::snprintf(line, sizeof(line), "NCCL %d from %s, %d CUDA devices", s->version, lib, count);
    host->log(host->host, HMC_LOG_DEBUG, "nccl", line);
  }
  *state = s;
  return HMC_PROV_OK;
}

void fini(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->lib != nullptr && !s->pinned) dlclose(s->lib);
  delete s;
}

// An init thread given up on may stay in ncclCommInitRank for as long as the missing rank
// takes, then return into this plugin and call NCCL: neither may be unloaded under it
// (fini's dlclose of libnccl, the host's of this file), for the rest of the process.
void pin_code(State* s) {
  s->pinned = true;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&pin_code), &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

const char* last_error(void*) { return g_error.c_str(); }

int supports(void*, int dtype, int op) {
  ncclRedOp_t unused;
  return dtype >= 0 && dtype < HMC_DTYPE_COUNT && map_op(op, &unused) ? 1 : 0;
}

int unique_id(void* state, void* id, size_t cap, size_t* len) {
  auto* s = static_cast<State*>(state);
  if (cap < sizeof(ncclUniqueId)) return fail(HMC_PROV_ERR_INVALID, "unique_id: %zu bytes of room, need %zu", cap, sizeof(ncclUniqueId));
  ncclUniqueId uid;
  if (const ncclResult_t r = s->f.get_unique_id(&uid); r != ncclSuccess) return nccl_fail(s, nullptr, r, "ncclGetUniqueId");
  std::memcpy(id, &uid, sizeof(uid));
  *len = sizeof(uid);
  return HMC_PROV_OK;
}

// One communicator init on its own thread; whoever finishes last (the thread, or a caller
// that gave up) cleans up.
struct InitJob {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  ncclResult_t result = ncclSuccess;
  ncclComm_t nc = nullptr;
};

int comm_init(void* state, const void* id, size_t id_len, int nranks, int rank, int device, int64_t timeout_ms,
              void** comm) {
  auto* s = static_cast<State*>(state);
  if (id_len != sizeof(ncclUniqueId)) return fail(HMC_PROV_ERR_INVALID, "comm_init: id of %zu bytes, NCCL's has %zu", id_len, sizeof(ncclUniqueId));
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof(uid));
  auto job = std::make_shared<InitJob>();
  const Nccl f = s->f;  // the thread may outlive this provider's state
  std::thread([job, f, uid, nranks, rank, device] {
    pthread_setname_np(pthread_self(), "hmc-nccl-init");
    ncclComm_t nc = nullptr;
    const ncclResult_t r = cudaSetDevice(device) == cudaSuccess ? f.comm_init(&nc, nranks, uid, rank) : ncclInvalidArgument;
    std::lock_guard lock(job->mu);
    if (job->abandoned) {
      if (nc != nullptr) f.comm_abort(nc);
      return;
    }
    job->result = r;
    job->nc = nc;
    job->done = true;
    job->cv.notify_all();
  }).detach();
  const int64_t limit = timeout_ms > 0 ? timeout_ms : 60000;
  std::unique_lock lock(job->mu);
  if (!job->cv.wait_for(lock, std::chrono::milliseconds(limit), [&] { return job->done; })) {
    job->abandoned = true;
    pin_code(s);
    return fail(HMC_PROV_ERR_PEER_LOST, "ncclCommInitRank: not done after %lld ms (a rank missing?)", static_cast<long long>(limit));
  }
  if (job->result != ncclSuccess) {
    const int rc = nccl_fail(s, job->nc, job->result, "ncclCommInitRank");
    if (job->nc != nullptr) s->f.comm_abort(job->nc);
    return rc;
  }
  *comm = new Comm{job->nc, device, limit};
  return HMC_PROV_OK;
}

int comm_destroy(void* state, void* comm) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  int rc = HMC_PROV_OK;
  if (c->nc != nullptr) {
    DeviceScope scope(c->device);
    const ncclResult_t r = s->f.comm_destroy(c->nc);
    if (r != ncclSuccess && r != ncclInProgress) rc = nccl_fail(s, nullptr, r, "ncclCommDestroy");
  }
  delete c;
  return rc;
}

int comm_abort(void* state, void* comm) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  if (c->nc != nullptr) {
    DeviceScope scope(c->device);
    s->f.comm_abort(c->nc);
  }
  delete c;
  return HMC_PROV_OK;
}

int comm_status(void* state, void* comm) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  if (c->nc == nullptr) return fail(HMC_PROV_ERR_CLOSED, "the NCCL communicator was aborted");
  ncclResult_t st = ncclSuccess;
  if (const ncclResult_t q = s->f.async_error(c->nc, &st); q != ncclSuccess) return nccl_fail(s, c->nc, q, "ncclCommGetAsyncError");
  return st == ncclSuccess || st == ncclInProgress ? HMC_PROV_OK : nccl_fail(s, c->nc, st, "NCCL communicator");
}

// Runs one NCCL call on the communicator's device and waits until it is queued.
template <class Call>
int queue(void* state, void* comm, const char* what, Call call) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  if (c->nc == nullptr) return fail(HMC_PROV_ERR_CLOSED, "%s: the NCCL communicator was aborted", what);
  DeviceScope scope(c->device);
  if (!scope.ok()) return fail(HMC_PROV_ERR_INTERNAL, "%s: cannot make CUDA device %d current", what, c->device);
  return settle(s, c, call(s->f, c->nc), what);
}

int check_args(int dtype, int op, ncclRedOp_t* nop, const char* what) {
  if (dtype < 0 || dtype >= HMC_DTYPE_COUNT) return fail(HMC_PROV_ERR_INVALID, "%s: unknown dtype %d", what, dtype);
  if (nop != nullptr && !map_op(op, nop)) return fail(HMC_PROV_ERR_UNSUPPORTED, "%s: op %d is not one NCCL runs as HMC defines it", what, op);
  return HMC_PROV_OK;
}

int all_reduce(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, void* stream) {
  ncclRedOp_t nop = ncclSum;
  if (const int rc = check_args(dtype, op, &nop, "all_reduce"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclAllReduce", [&](const Nccl& f, ncclComm_t nc) {
    return f.all_reduce(send, recv, count, kDtype[dtype], nop, nc, static_cast<cudaStream_t>(stream));
  });
}

int broadcast(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int root, void* stream) {
  if (const int rc = check_args(dtype, 0, nullptr, "broadcast"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclBroadcast", [&](const Nccl& f, ncclComm_t nc) {
    return f.broadcast(send, recv, count, kDtype[dtype], root, nc, static_cast<cudaStream_t>(stream));
  });
}

int reduce(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, int root,
           void* stream) {
  ncclRedOp_t nop = ncclSum;
  if (const int rc = check_args(dtype, op, &nop, "reduce"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclReduce", [&](const Nccl& f, ncclComm_t nc) {
    return f.reduce(send, recv, count, kDtype[dtype], nop, root, nc, static_cast<cudaStream_t>(stream));
  });
}

int all_gather(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, void* stream) {
  if (const int rc = check_args(dtype, 0, nullptr, "all_gather"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclAllGather", [&](const Nccl& f, ncclComm_t nc) {
    return f.all_gather(send, recv, count, kDtype[dtype], nc, static_cast<cudaStream_t>(stream));
  });
}

int reduce_scatter(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                   void* stream) {
  ncclRedOp_t nop = ncclSum;
  if (const int rc = check_args(dtype, op, &nop, "reduce_scatter"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclReduceScatter", [&](const Nccl& f, ncclComm_t nc) {
    return f.reduce_scatter(send, recv, count, kDtype[dtype], nop, nc, static_cast<cudaStream_t>(stream));
  });
}

int send(void* state, void* comm, const void* buf, size_t count, int dtype, int peer, void* stream) {
  if (const int rc = check_args(dtype, 0, nullptr, "send"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclSend", [&](const Nccl& f, ncclComm_t nc) {
    return f.send(buf, count, kDtype[dtype], peer, nc, static_cast<cudaStream_t>(stream));
  });
}

int recv(void* state, void* comm, void* buf, size_t count, int dtype, int peer, void* stream) {
  if (const int rc = check_args(dtype, 0, nullptr, "recv"); rc != HMC_PROV_OK) return rc;
  return queue(state, comm, "ncclRecv", [&](const Nccl& f, ncclComm_t nc) {
    return f.recv(buf, count, kDtype[dtype], peer, nc, static_cast<cudaStream_t>(stream));
  });
}

int group_start(void* state) {
  auto* s = static_cast<State*>(state);
  const ncclResult_t r = s->f.group_start();
  return r == ncclSuccess ? HMC_PROV_OK : nccl_fail(s, nullptr, r, "ncclGroupStart");
}

int group_end(void* state, void* comm) {
  return queue(state, comm, "ncclGroupEnd", [](const Nccl& f, ncclComm_t) { return f.group_end(); });
}

const hmc_ccl_provider_t kTable = {
    .struct_size = sizeof(hmc_ccl_provider_t),
    .abi_version = HMC_CCL_ABI_VERSION,
    .name = "nccl",
    .caps = 0,
    .params = kParams,
    .num_params = sizeof(kParams) / sizeof(kParams[0]),
    .device_provider = "cuda",
    .init = init,
    .fini = fini,
    .last_error = last_error,
    .supports = supports,
    .unique_id = unique_id,
    .comm_init = comm_init,
    .comm_destroy = comm_destroy,
    .comm_abort = comm_abort,
    .comm_status = comm_status,
    .all_reduce = all_reduce,
    .broadcast = broadcast,
    .reduce = reduce,
    .all_gather = all_gather,
    .reduce_scatter = reduce_scatter,
    .send = send,
    .recv = recv,
    .group_start = group_start,
    .group_end = group_end,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hmc_ccl_provider_t* hmc_ccl_provider_v1(void) { return &kTable; }
