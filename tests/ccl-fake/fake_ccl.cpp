// A collective provider for tests only ("fake", device provider "cpu"): it lets CI run the
// whole delegation layer (collectives/ccl.cpp: the agreement, the vendor communicator,
// queued work, avg, staging, failures) with host memory and no GPU. Each communicator is
// a POSIX shared-memory file named by its id, one slot per rank; every operation runs at
// once on the calling thread: copy in, barrier, compute from every slot, barrier. Sums
// use the cpu provider's own kernels, in rank order, so results match HMC's reference.
// Never installed; tests opt in with HMC_PROVIDER_PATH=<build>/lib/test-ccl.
//
// HMC_FAKE_SLOT (bytes per rank, default 4 MiB) bounds a message; HMC_FAKE_FAIL_RANK
// makes that rank's operations fail (the failure path); the others then fail in their next wait.
// HMC_FAKE_NO_ID=1 refuses communicator ids, so that delegation is decided off.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_reduce.h"
#include "cpu_state.h"
#include "hmc/provider/ccl.h"

namespace {
thread_local std::string g_error;
}  // namespace

// Our failures, and those of the cpu kernels (they report through hmc::cpu::fail).
namespace hmc::cpu {
int fail(int code, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_error = buf;
  return code;
}
}  // namespace hmc::cpu

namespace {

using hmc::cpu::fail;

constexpr size_t kDtypeSize[HMC_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

struct Header {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> failed;  // rank + 1 of a rank whose operation failed (HMC_FAKE_FAIL_RANK)
};

struct Comm {
  int rank = 0, size = 0;
  size_t slot = 0;
  int64_t timeout_ms = 0;
  Header* hdr = nullptr;
  uint8_t* slots = nullptr;
  size_t map_bytes = 0;
  bool broken = false;
  uint8_t* mine() const { return slots + static_cast<size_t>(rank) * slot; }
  const uint8_t* of(int r) const { return slots + static_cast<size_t>(r) * slot; }
};

struct Group {
  struct Op {
    bool send;
    void* buf;
    size_t bytes;
    int peer;
  };
  bool open = false;
  std::vector<Op> ops;
};

struct State {
  hmc::cpu::State cpu;  // the reduce kernels' settings (baseline kernels)
  size_t slot = 4 << 20;
  int fail_rank = -1;
  bool no_id = false;
  Group group;
};

// Sense by generation: the last to arrive starts the next generation.
int barrier(Comm* c) {
  if (c->broken) return fail(HMC_PROV_ERR_PEER_LOST, "fake: the communicator failed before");
  const uint32_t gen = c->hdr->generation.load();
  if (c->hdr->arrived.fetch_add(1) + 1 == static_cast<uint32_t>(c->size)) {
    c->hdr->arrived.store(0);
    c->hdr->generation.fetch_add(1);
    return HMC_PROV_OK;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(c->timeout_ms);
  while (c->hdr->generation.load() == gen) {
    if (const uint32_t failed = c->hdr->failed.load()) {  // as a real library's peers would, only at once
      c->broken = true;
      return fail(HMC_PROV_ERR_PEER_LOST, "fake: rank %u failed", failed - 1);
    }
    if (std::chrono::steady_clock::now() > until) {
      c->broken = true;
      return fail(HMC_PROV_ERR_PEER_LOST, "fake: a rank did not arrive within %lld ms", static_cast<long long>(c->timeout_ms));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return HMC_PROV_OK;
}

int check(State* s, Comm* c, size_t bytes, const char* what) {
  if (c->rank == s->fail_rank) {
    c->broken = true;
    c->hdr->failed.store(static_cast<uint32_t>(c->rank) + 1);
    return fail(HMC_PROV_ERR_INTERNAL, "fake: %s fails on rank %d (HMC_FAKE_FAIL_RANK)", what, c->rank);
  }
  if (bytes > c->slot) return fail(HMC_PROV_ERR_UNSUPPORTED, "fake: %s of %zu bytes exceeds the %zu-byte slot", what, bytes, c->slot);
  return HMC_PROV_OK;
}

// dst = reduce over ranks, in rank order, of slot[r] + offset.
int reduce_slots(State* s, Comm* c, void* dst, size_t offset, size_t count, int dtype, int op) {
  const size_t bytes = count * kDtypeSize[dtype];
  std::vector<uint8_t> acc(c->of(0) + offset, c->of(0) + offset + bytes);
  for (int r = 1; r < c->size; ++r)
    if (hmc::cpu::reduce(&s->cpu, acc.data(), acc.data(), c->of(r) + offset, count, dtype, op, nullptr) != 0)
      return fail(HMC_PROV_ERR_INVALID, "fake: reduce of dtype %d op %d failed", dtype, op);
  std::memcpy(dst, acc.data(), bytes);
  return HMC_PROV_OK;
}

int init(const hmc_host_services_t* host, void** state, char*, size_t) {
  auto* s = new State();
  char v[64];
  if (host->config_get && host->config_get(host->host, "HMC_FAKE_SLOT", v, sizeof(v)) == 0) s->slot = std::strtoull(v, nullptr, 10);
  if (host->config_get && host->config_get(host->host, "HMC_FAKE_FAIL_RANK", v, sizeof(v)) == 0) s->fail_rank = std::atoi(v);
  if (host->config_get && host->config_get(host->host, "HMC_FAKE_NO_ID", v, sizeof(v)) == 0) s->no_id = std::atoi(v) != 0;
  *state = s;
  return HMC_PROV_OK;
}

void fini(void* state) { delete static_cast<State*>(state); }
const char* last_error(void*) { return g_error.c_str(); }
int supports(void*, int dtype, int op) { return dtype >= 0 && dtype < HMC_DTYPE_COUNT && op >= 0 && op < HMC_OP_AVG; }

int unique_id(void* state, void* id, size_t cap, size_t* len) {
  if (static_cast<State*>(state)->no_id) return fail(HMC_PROV_ERR_UNSUPPORTED, "fake: no ids (HMC_FAKE_NO_ID)");
  std::random_device rd;
  const std::string name = "/hmc-fakeccl-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  if (cap < name.size() + 1) return fail(HMC_PROV_ERR_INVALID, "fake: id needs %zu bytes", name.size() + 1);
  std::memcpy(id, name.c_str(), name.size() + 1);
  *len = name.size() + 1;
  return HMC_PROV_OK;
}

int comm_init(void* state, const void* id, size_t id_len, int nranks, int rank, int, int64_t timeout_ms, void** comm) {
  auto* s = static_cast<State*>(state);
  const std::string name(static_cast<const char*>(id), strnlen(static_cast<const char*>(id), id_len));
  auto* c = new Comm{rank, nranks, s->slot, timeout_ms};
  c->map_bytes = 4096 + static_cast<size_t>(nranks) * c->slot;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(c->map_bytes)) != 0) {
    if (fd >= 0) close(fd);
    delete c;
    return fail(HMC_PROV_ERR_INTERNAL, "fake: shm_open/ftruncate %s: %s", name.c_str(), std::strerror(errno));
  }
  void* p = mmap(nullptr, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    delete c;
    return fail(HMC_PROV_ERR_INTERNAL, "fake: mmap: %s", std::strerror(errno));
  }
  c->hdr = static_cast<Header*>(p);  // a fresh file is zeroes: a valid header
  c->slots = static_cast<uint8_t*>(p) + 4096;
  const int rc = barrier(c);
  if (rank == 0) shm_unlink(name.c_str());  // everyone has it mapped now (or failed)
  if (rc != HMC_PROV_OK) {
    munmap(p, c->map_bytes);
    delete c;
    return rc;
  }
  *comm = c;
  return HMC_PROV_OK;
}

int comm_destroy(void*, void* comm) {
  auto* c = static_cast<Comm*>(comm);
  munmap(c->hdr, c->map_bytes);
  delete c;
  return HMC_PROV_OK;
}

int comm_status(void*, void* comm) {
  return static_cast<Comm*>(comm)->broken ? fail(HMC_PROV_ERR_PEER_LOST, "fake: the communicator failed") : HMC_PROV_OK;
}

// copy in, barrier, `out` reads the slots, barrier.
template <class Out>
int exchange(Comm* c, const void* in, size_t in_bytes, Out out) {
  if (in && in_bytes) std::memcpy(c->mine(), in, in_bytes);
  int rc = barrier(c);
  if (rc == HMC_PROV_OK) rc = out();
  const int rc2 = barrier(c);
  return rc != HMC_PROV_OK ? rc : rc2;
}

int all_reduce(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, void*) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  const size_t bytes = count * kDtypeSize[dtype];
  if (const int rc = check(s, c, bytes, "all_reduce")) return rc;
  return exchange(c, send, bytes, [&] { return reduce_slots(s, c, recv, 0, count, dtype, op); });
}

int reduce(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, int root, void*) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  const size_t bytes = count * kDtypeSize[dtype];
  if (const int rc = check(s, c, bytes, "reduce")) return rc;
  return exchange(c, send, bytes, [&] { return c->rank == root ? reduce_slots(s, c, recv, 0, count, dtype, op) : 0; });
}

int broadcast(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int root, void*) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  const size_t bytes = count * kDtypeSize[dtype];
  if (const int rc = check(s, c, bytes, "broadcast")) return rc;
  return exchange(c, c->rank == root ? send : nullptr, bytes, [&] {
    std::memmove(recv, c->of(root), bytes);
    return 0;
  });
}

int all_gather(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, void*) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  const size_t bytes = count * kDtypeSize[dtype];
  if (const int rc = check(s, c, bytes, "all_gather")) return rc;
  return exchange(c, send, bytes, [&] {
    for (int r = 0; r < c->size; ++r) std::memmove(static_cast<uint8_t*>(recv) + r * bytes, c->of(r), bytes);
    return 0;
  });
}

int reduce_scatter(void* state, void* comm, const void* send, void* recv, size_t count, int dtype, int op, void*) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  const size_t bytes = count * kDtypeSize[dtype];
  if (const int rc = check(s, c, bytes * c->size, "reduce_scatter")) return rc;
  return exchange(c, send, bytes * c->size, [&] { return reduce_slots(s, c, recv, c->rank * bytes, count, dtype, op); });
}

int queue_p2p(void* state, void* comm, bool is_send, const void* buf, size_t count, int dtype, int peer) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  if (!s->group.open) return fail(HMC_PROV_ERR_UNSUPPORTED, "fake: send/recv only inside a group");
  if (peer < 0 || peer >= c->size) return fail(HMC_PROV_ERR_INVALID, "fake: peer %d", peer);
  s->group.ops.push_back({is_send, const_cast<void*>(buf), count * kDtypeSize[dtype], peer});
  return HMC_PROV_OK;
}
int send(void* st, void* comm, const void* buf, size_t count, int dtype, int peer, void*) {
  return queue_p2p(st, comm, true, buf, count, dtype, peer);
}
int recv(void* st, void* comm, void* buf, size_t count, int dtype, int peer, void*) {
  return queue_p2p(st, comm, false, buf, count, dtype, peer);
}

int group_start(void* state) {
  auto* s = static_cast<State*>(state);
  s->group.open = true;
  s->group.ops.clear();
  return HMC_PROV_OK;
}

// One send per peer: each rank's slot holds a sub-slot per destination.
int group_end(void* state, void* comm) {
  auto* s = static_cast<State*>(state);
  auto* c = static_cast<Comm*>(comm);
  s->group.open = false;
  const size_t sub = c->slot / static_cast<size_t>(c->size);
  for (auto& o : s->group.ops) {
    if (const int rc = check(s, c, o.bytes * c->size, "group")) return rc;
    if (o.send) std::memcpy(c->mine() + o.peer * sub, o.buf, o.bytes);
  }
  return exchange(c, nullptr, 0, [&] {
    for (auto& o : s->group.ops)
      if (!o.send) std::memcpy(o.buf, c->of(o.peer) + c->rank * sub, o.bytes);
    return 0;
  });
}

const hmc_param_t kParams[] = {
    {"HMC_FAKE_SLOT", "size", "4194304", "test provider: bytes per rank and message"},
    {"HMC_FAKE_FAIL_RANK", "int", "-1", "test provider: this rank's operations fail"},
    {"HMC_FAKE_NO_ID", "int", "0", "test provider: 1 refuses communicator ids"},
};

const hmc_ccl_provider_t kTable = {
    .struct_size = sizeof(hmc_ccl_provider_t),
    .abi_version = HMC_CCL_ABI_VERSION,
    .name = "fake",
    .caps = HMC_CCL_CAP_SHARED_DEVICE,  // every rank's "device" is cpu:0
    .params = kParams,
    .num_params = 3,
    .device_provider = "cpu",
    .init = init,
    .fini = fini,
    .last_error = last_error,
    .supports = supports,
    .unique_id = unique_id,
    .comm_init = comm_init,
    .comm_destroy = comm_destroy,
    .comm_abort = comm_destroy,
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
