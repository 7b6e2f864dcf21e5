// hmc-probe internals: spawning local ranks, measuring paths, references, printing.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hmc/hmc.h"

namespace hmc::probe {

struct PairFigures {
  int from = 0, to = 0;
  std::string provider, reason, peer_host;
  std::string from_device, to_device;  // where the buffers were ("cuda:0", "cpu:0")
  std::string device_path;             // how device memory moved (IPC, staging), empty for host memory
  double bandwidth_gbps = 0;  // one way, `bytes` per message
  double latency_us = 0;      // half round trip of 8 bytes
  double poll_ns = 0;         // one Request::test on `from` that finds nothing done
  std::size_t eager_limit = 0;  // larger messages go by rendezvous (PathInfo::eager_limit)
  std::size_t get_limit = 0;    // rendezvous up to this size by get (PathInfo::get_limit)
  std::size_t get_from = SIZE_MAX;  // and from this size up (PathInfo::get_from)
  std::size_t eager_window = 0;  // eager bytes ahead of the receiver (PathInfo::eager_window)
  int64_t credit_wait_us = 0;    // a send past the window waits this long (PathInfo::credit_wait)
  std::size_t split_from = SIZE_MAX;  // rendezvous from this size up split (PathInfo::split_from)
  std::size_t turns_from = SIZE_MAX;  // unsplit rendezvous from this size up copied in turns (PathInfo::turns_from)
};

// Bandwidth messages in flight per pair; with --rotate each has a `bytes` slot of its own.
constexpr int kWindow = 4;

struct MeasureOptions {
  std::size_t bytes = 64u << 20;
  int iters = 20;
  int lat_iters = 2000;
  // Round trips before the timed ones (ucx_perftest's -w; it warms up 10000).
  int lat_warmup = 10;
  std::string device = "cpu";  // --device: provider[:index][@ranks] (tools/common/device_spec.h)
  bool put = false;  // --put: bandwidth of one-sided puts into the peer's registered buffer
  bool notify = false;  // --notify: every put carries a notification the target waits for
  bool lat_poll = false;  // --lat-poll: latency with Request::test polled back to back, not wait()
  std::string memory = "shareable";  // --memory: host buffers from kShareable, kDefault or malloc
  bool rotate = false;  // --rotate: the messages in flight each have a buffer of their own
};

// A rank's buffer: from Context::alloc, or (--memory malloc) from the heap.
struct Buffer {
  Memory mem;
  std::vector<uint8_t> heap;
  void* data() { return heap.empty() ? mem.data() : heap.data(); }
  std::size_t size() const { return heap.empty() ? mem.size() : heap.size(); }
};

// Bytes of a rank's buffer for `opt` (kWindow slots with --rotate); an error where that
// overflows a size_t. Checked at option parsing and again before allocating.
Result<std::size_t> buffer_bytes(const MeasureOptions& opt);
// `v` as `bytes` of `value` from the heap; a size the heap cannot give is an error worded
// as Context::alloc's, not an exception.
Status heap_filled(std::vector<uint8_t>& v, std::size_t bytes, uint8_t value);

// Runs inside one rank: measures the path to every peer, pair by pair; rank 0 returns all.
Result<std::vector<PairFigures>> measure_all(Context& ctx, Communicator& comm, const MeasureOptions& opt);

// References measured in one process on this machine, same sizes; `iters` messages, or as
// many as make 4 GiB where that is fewer.
double memcpy_gbps(std::size_t bytes, int iters);
double tcp_stream_gbps(std::size_t bytes, int iters);

nlohmann::json providers_json(const Context& ctx);
void print_overview(const Context& ctx);
void print_config(const Context& ctx);
void print_matrix(int size, const std::vector<PairFigures>& figs, const MeasureOptions& opt,
                  double memcpy_ref, double tcp_ref);
nlohmann::json matrix_json(int size, const std::vector<PairFigures>& figs, const MeasureOptions& opt,
                           double memcpy_ref, double tcp_ref);

}  // namespace hmc::probe
