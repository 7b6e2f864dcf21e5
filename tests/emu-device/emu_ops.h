// The entry points of the emulated device provider, one file per area; the table in
// emu_provider.cpp points at them.
#pragma once

#include "emu_state.h"

namespace hmc::emu {

// emu_memory.cpp
int mem_alloc(void* state, int device, size_t bytes, int alloc_kind, void** ptr);
int mem_free(void* state, int device, void* ptr);
int copy(void* state, void* dst, const void* src, size_t bytes, void* stream);
int peer_access(void* state, int device, int peer_device, int* can_access);
int mem_query(void* state, const void* ptr, int* device, void** base, size_t* bytes, uint64_t* id);

// emu_ipc.cpp
int ipc_export(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
               size_t* handle_len);
int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr);
int ipc_close(void* state, void* ptr);
int ipc_extent(void* state, void* ptr, size_t* bytes);

// emu_stream.cpp
int stream_create(void* state, int device, void** stream);
int stream_destroy(void* state, void* stream);
int stream_query(void* state, void* stream);
int event_create(void* state, int device, void** event);
int event_destroy(void* state, void* event);
int event_record(void* state, void* event, void* stream);
int stream_wait_event(void* state, void* stream, void* event);
int event_query(void* state, void* event);
int flag_alloc(void* state, int device, volatile uint32_t** flag);
int flag_free(void* state, volatile uint32_t* flag);
int stream_wait_flag(void* state, void* stream, volatile uint32_t* flag, uint32_t value);
// With HMC_EMU_DEVICE_WIDE_FREES, waits until no stream has work queued, as CUDA's frees
// wait for the device; INTERNAL (noted "device-wide-wait-stuck") after 5 s. `what` names
// the caller in the error.
int wait_device_idle(State* s, const char* what);
// Destroys every stream, event and flag the host left behind; called by fini.
// Appends "<what> <n>" to HMC_EMU_REGISTER_LOG, when set, for tests to count.
void note(const State* s, const char* what, size_t n);
struct Leftovers {
  size_t streams = 0, events = 0, flags = 0;
};
Leftovers release_objects(State* s);

// emu_register.cpp
int host_register(void* state, void* ptr, size_t bytes);
int host_unregister(void* state, void* ptr);
// Forgets what the host left registered (logging each); called by fini. Returns how many.
size_t release_registrations(State* s);

// emu_reduce.cpp
int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream);
int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream);

}  // namespace hmc::emu
