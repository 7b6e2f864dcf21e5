// Host memory for the cpu provider: plain, pinned (mlock) and shareable (memfd) blocks,
// and IPC of shareable blocks between processes of one host through /proc/<pid>/fd.
#pragma once

#include <cstddef>

#include "cpu_state.h"

namespace hmc::cpu {

int mem_alloc(void* state, int device, size_t bytes, int alloc_kind, void** ptr);
int mem_free(void* state, int device, void* ptr);
int copy(void* state, void* dst, const void* src, size_t bytes, void* stream);

int ipc_export(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
               size_t* handle_len);
int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr);
int ipc_close(void* state, void* ptr);
int ipc_extent(void* state, void* ptr, size_t* bytes);

// Unmaps what the host left allocated or imported; called by fini. Returns how many.
size_t release_all(State* s);

}  // namespace hmc::cpu
