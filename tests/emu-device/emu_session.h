// Test helpers for the emulated device: a dlopened, initialised provider with host
// services of our own, and child processes with pipes, deadlines and reaping.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

#include "hmc/provider/device.h"

namespace hmc::emu_test {

using Config = std::map<std::string, std::string>;
constexpr std::chrono::seconds kDeadline{20};

// One provider instance: dlopen(path) + init(config). The helpers below REQUIRE, so
// only tests use them; a child process calls the table itself.
class Plugin {
 public:
  explicit Plugin(const char* path, Config config = {});
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const hmc_device_provider_t* p = nullptr;
  void* state = nullptr;
  int init_rc = HMC_PROV_ERR_INTERNAL;
  std::string reason;  // of a failed dlopen or init
  std::string error() const { return p->last_error(state); }

  void* alloc(int device, size_t bytes, int kind = HMC_ALLOC_DEVICE);  // REQUIREs success
  void free(int device, void* ptr);
  void write(void* dst, const std::vector<uint8_t>& src);  // synchronous copy, REQUIREd
  std::vector<uint8_t> read(const void* src, size_t n);
  // Polls query (stream_query or event_query) until it is not 1; returns its last answer.
  int wait(int (*query)(void*, void*), void* object);

 private:
  void* dl_ = nullptr;
  Config config_;
  hmc_host_services_t host_{};
};

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed);

// A re-executed copy of this test program (argv: --emu-child <role> <in fd> <out fd>).
struct Child {
  pid_t pid = -1;
  int to = -1;    // we write, the child reads
  int from = -1;  // the child writes, we read
};
Child spawn_child(const std::string& role);
// Message framing over the pipes; false on EOF, error or the deadline.
bool send_msg(int fd, const std::vector<uint8_t>& msg);
bool recv_msg(int fd, std::vector<uint8_t>* msg, std::chrono::seconds deadline = kDeadline);
// waitpid with a deadline; SIGKILLs and reaps the child when it passes. Returns the status.
int reap(pid_t pid, std::chrono::seconds deadline = kDeadline);
void close_child(Child& c);

// The child roles, dispatched by test_main.cpp.
int ipc_child(int in, int out);      // "ipc"
int ipc_app_child(int in, int out);  // "ipc-app"

}  // namespace hmc::emu_test
