// Measuring each pair's path: one pair at a time so pairs do not disturb each other.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <stdexcept>

#include "device_spec.h"
#include "hmc/collectives.h"
#include "probe.h"

namespace hmc::probe {
namespace {

constexpr uint64_t kDataTag = 11, kAckTag = 12, kResultTag = 13, kPollTag = 14;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Issues `n` operations, kWindow in flight, and waits for all of them.
template <class Issue>
Status windowed(int n, const Issue& issue) {
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    if (reqs.size() == kWindow) {
      HMC_RETURN_IF_ERROR(reqs.front().wait());
      reqs.erase(reqs.begin());
    }
    reqs.push_back(issue());
  }
  return wait_all(reqs.data(), reqs.size());
}

// Messages in the warm-up round before the timed one: connections, registrations, caches.
int warmup_count(int iters) { return std::max(2, iters / 10); }

// Where message i of `bytes` starts in `buf`: with --rotate (`rotate`) the buffer holds
// kWindow messages and the messages in flight take them in turn; else each is at the start.
std::size_t slot(std::size_t bytes, int i, bool rotate) {
  return rotate ? bytes * static_cast<std::size_t>(i % kWindow) : 0;
}

// Sender streams `iters` messages of `bytes` (kWindow in flight), the receiver acknowledges
// the last.
Result<double> bandwidth(Communicator& c, int peer, bool sender, Buffer& buf, std::size_t bytes, bool rotate, int iters) {
  uint8_t ack = 0;
  for (int round = 0; round < 2; ++round) {
    int n = round == 0 ? warmup_count(iters) : iters;
    int i = 0;
    auto t0 = Clock::now();
    HMC_RETURN_IF_ERROR(windowed(n, [&] {
      uint8_t* at = static_cast<uint8_t*>(buf.data()) + slot(bytes, i++, rotate);
      return sender ? c.isend(at, bytes, peer, kDataTag) : c.irecv(at, bytes, peer, kDataTag);
    }));
    HMC_RETURN_IF_ERROR(sender ? c.recv(&ack, 1, peer, kAckTag) : c.send(&ack, 1, peer, kAckTag));
    if (round == 1) return static_cast<double>(bytes) * n / seconds_since(t0) / 1e9;
  }
  return 0.0;
}

// Every rank's remote key of its buffer, on every rank (for --put).
Result<std::vector<RemoteKey>> all_keys(Communicator& c, const RemoteKey& mine) {
  uint64_t len = mine.bytes.size(), longest = 0;
  HMC_RETURN_IF_ERROR(all_reduce(c, &len, &longest, 1, DataType::kUint64, ReduceOp::kMax).wait());
  std::vector<uint8_t> padded(8 + longest), all((8 + longest) * c.size());
  std::memcpy(padded.data(), &len, 8);
  std::memcpy(padded.data() + 8, mine.bytes.data(), len);
  HMC_RETURN_IF_ERROR(all_gather(c, padded.data(), all.data(), padded.size(), DataType::kUint8).wait());
  std::vector<RemoteKey> keys(c.size());
  for (int r = 0; r < c.size(); ++r) {
    const uint8_t* rec = all.data() + r * padded.size();
    std::memcpy(&len, rec, 8);
    keys[r].bytes.assign(rec + 8, rec + 8 + len);
  }
  return keys;
}

// The sender puts `iters` times into the peer's buffer (kWindow in flight), then tells the
// peer it is done; the time runs until the last put completed (its data is in the peer's
// memory). With `notify`, every put carries its number and the time runs until the target
// has taken every notification (Communicator::wait_notify), each checked to come in order.
Result<double> put_bandwidth(Communicator& c, int peer, bool sender, Buffer& buf, std::size_t bytes, bool rotate,
                             const RemoteKey& key, int iters, bool notify) {
  uint8_t done = 0;
  uint64_t seq = 0;
  double gbps = 0;
  for (int round = 0; round < 2; ++round) {  // round 0 also has the key checked
    int n = round == 0 ? warmup_count(iters) : iters;
    if (!sender) {
      for (int i = 0; notify && i < n; ++i, ++seq) {
        auto v = c.wait_notify(peer);
        if (!v) return v.status();
        if (v.value() != seq)
          return Status(ErrorCode::kInternal, "notification " + std::to_string(v.value()) + " came where " +
                                                  std::to_string(seq) + " was due");
      }
      if (notify) HMC_RETURN_IF_ERROR(c.send(&done, 1, peer, kAckTag));
      continue;
    }
    int i = 0;
    auto t0 = Clock::now();
    HMC_RETURN_IF_ERROR(windowed(n, [&] {
      const std::size_t at = slot(bytes, i++, rotate);
      const uint8_t* src = static_cast<uint8_t*>(buf.data()) + at;
      return notify ? c.put(peer, src, bytes, key, at, seq++) : c.put(peer, src, bytes, key, at);
    }));
    if (notify) HMC_RETURN_IF_ERROR(c.recv(&done, 1, peer, kAckTag));
    gbps = static_cast<double>(bytes) * n / seconds_since(t0) / 1e9;
  }
  if (!notify) HMC_RETURN_IF_ERROR(sender ? c.send(&done, 1, peer, kAckTag) : c.recv(&done, 1, peer, kAckTag));
  return gbps;
}

// Polls `r` with Request::test back to back, as ucx_perftest polls: no yield, no sleep. An
// answer that takes more than kPolls tests (far beyond any round trip) is waited for with
// Request::wait, which carries HMC_TIMEOUT: a lost peer ends the measurement, not a hang.
Status poll(Request r) {
  constexpr unsigned kPolls = 1u << 20;
  for (unsigned n = 0; n < kPolls; ++n)
    if (r.test()) return r.status();
  return r.wait();
}

// Ping-pong of 8 bytes; each side posts its receive before it sends. The count is 64-bit:
// --lat-iters and --lat-warmup may each be up to INT_MAX.
Result<double> latency(Communicator& c, int peer, bool first, int iters, int warmup, bool polled) {
  // Not on the stack: an error return may leave a receive posted into `in`.
  static uint64_t in = 0, out = 0;
  auto t0 = Clock::now();
  const int64_t total = int64_t{iters} + warmup;
  for (int64_t i = 0; i < total; ++i) {
    if (i == warmup) t0 = Clock::now();
    if (first) {
      Request r = c.irecv(&in, 8, peer, kAckTag);
      Request s = c.isend(&out, 8, peer, kAckTag);
      HMC_RETURN_IF_ERROR(polled ? poll(s) : s.wait());
      HMC_RETURN_IF_ERROR(polled ? poll(r) : r.wait());
    } else {
      Request r = c.irecv(&in, 8, peer, kAckTag);
      HMC_RETURN_IF_ERROR(polled ? poll(r) : r.wait());
      HMC_RETURN_IF_ERROR(polled ? poll(c.isend(&out, 8, peer, kAckTag)) : c.send(&out, 8, peer, kAckTag));
    }
  }
  return seconds_since(t0) / iters / 2 * 1e6;
}

// What one poll costs when nothing is ready: `first` polls a receive its peer satisfies
// only after (the work every waiting loop repeats: each provider in use, each connection).
Result<double> empty_poll_ns(Communicator& c, int peer, bool first) {
  constexpr int kPolls = 200000;
  static uint8_t in = 0, out = 0;  // not on the stack: an error return may leave the receive posted
  if (!first) {  // waits until the peer polled, then satisfies its receive
    HMC_RETURN_IF_ERROR(c.recv(&in, 1, peer, kPollTag));
    HMC_RETURN_IF_ERROR(c.send(&out, 1, peer, kPollTag));
    return 0.0;
  }
  Request r = c.irecv(&in, 1, peer, kPollTag);
  const auto t0 = Clock::now();
  for (int i = 0; i < kPolls; ++i)
    if (r.test()) return Status(ErrorCode::kInternal, "the poll probe's receive completed before its send");
  const double ns = seconds_since(t0) / kPolls * 1e9;
  HMC_RETURN_IF_ERROR(c.send(&out, 1, peer, kPollTag));
  HMC_RETURN_IF_ERROR(r.wait());
  return ns;
}

// Every rank's device name, on every rank.
Result<std::vector<std::string>> all_devices(Communicator& c, const DeviceId& mine) {
  constexpr std::size_t kLen = 32;
  std::vector<char> names(kLen * c.size()), own(kLen);
  std::snprintf(own.data(), kLen, "%s", mine.to_string().c_str());
  HMC_RETURN_IF_ERROR(all_gather(c, own.data(), names.data(), kLen, DataType::kInt8).wait());
  std::vector<std::string> out;
  for (int r = 0; r < c.size(); ++r) out.emplace_back(names.data() + r * kLen, strnlen(names.data() + r * kLen, kLen));
  return out;
}

// Host memory as --memory says: shareable (what a provider needs for its fastest path: shm
// maps it directly), Context::alloc's default, or the heap like an application's own.
// Device memory: the device's own, filled through Context::copy.
Result<Buffer> buffer(Context& ctx, const DeviceId& dev, std::size_t bytes, const std::string& memory) {
  Buffer b;
  const bool host = dev.provider == "cpu";
  if (host && memory == "malloc") {
    HMC_RETURN_IF_ERROR(heap_filled(b.heap, bytes, 1));
    return b;
  }
  auto mem = ctx.alloc(dev, bytes, host && memory == "shareable" ? AllocKind::kShareable : AllocKind::kDefault);
  if (!mem) return mem.status();
  b.mem = std::move(mem.value());
  if (host) {
    std::memset(b.data(), 1, bytes);
  } else {
    std::vector<uint8_t> ones;
    HMC_RETURN_IF_ERROR(heap_filled(ones, bytes, 1));
    HMC_RETURN_IF_ERROR(ctx.copy(b.data(), ones.data(), bytes));
  }
  return b;
}

}  // namespace

Status heap_filled(std::vector<uint8_t>& v, std::size_t bytes, uint8_t value) {
  auto no_memory = [&](const char* why) {
    return Status(ErrorCode::kNoMemory, "allocating " + std::to_string(bytes) + " bytes on the heap failed: " + why);
  };
  try {
    v.assign(bytes, value);
  } catch (const std::length_error&) {
    return no_memory("more than a std::vector holds");
  } catch (const std::bad_alloc&) {
    return no_memory("std::bad_alloc");
  }
  return {};
}

Result<std::size_t> buffer_bytes(const MeasureOptions& opt) {
  const std::size_t slots = opt.rotate ? kWindow : 1;
  if (opt.bytes > std::numeric_limits<std::size_t>::max() / slots)
    return Status(ErrorCode::kInvalidArgument, "-b " + std::to_string(opt.bytes) + " with --rotate needs a buffer of " +
                                                   std::to_string(slots) + " x that, more than a size_t holds");
  return opt.bytes * slots;
}

Result<std::vector<PairFigures>> measure_all(Context& ctx, Communicator& c, const MeasureOptions& opt) {
  auto spec = tools::parse_device_spec(opt.device);
  if (!spec) return spec.status();
  auto dev = tools::pick_device(ctx, c, spec.value());
  if (!dev) return dev.status();
  auto bytes = buffer_bytes(opt);
  if (!bytes) return bytes.status();
  auto buf = buffer(ctx, dev.value(), bytes.value(), opt.memory);
  if (!buf) return buf.status();
  // A measurement that failed may leave transfers of `buf` under way with its peer: the
  // communicator is aborted before the buffer goes (docs/collectives.md, "Errors"), as
  // hmc-bench does.
  struct AbortUnlessDone {
    Communicator& c;
    bool done = false;
    ~AbortUnlessDone() {
      if (!done) c.abort();
    }
  } guard{c};
  auto devices = all_devices(c, dev.value());
  if (!devices) return devices.status();
  std::optional<MemoryRegion> region;  // --put: this rank's buffer as a put target
  std::vector<RemoteKey> keys;
  if (opt.put) {
    auto mr = c.register_memory(buf->data(), buf->size());
    if (!mr) return mr.status();
    auto k = all_keys(c, mr->pack());
    if (!k) return k.status();
    region = std::move(mr.value());
    keys = std::move(k.value());
  }
  std::vector<PairFigures> mine;
  for (int a = 0; a < c.size(); ++a) {
    for (int b = 0; b < c.size(); ++b) {
      if (a == b) continue;
      HMC_RETURN_IF_ERROR(c.barrier());
      if (c.rank() != a && c.rank() != b) continue;
      int peer = c.rank() == a ? b : a;
      auto bw = opt.put ? put_bandwidth(c, peer, c.rank() == a, buf.value(), opt.bytes, opt.rotate, keys[peer], opt.iters,
                                        opt.notify)
                        : bandwidth(c, peer, c.rank() == a, buf.value(), opt.bytes, opt.rotate, opt.iters);
      if (!bw) return bw.status();
      auto lat = latency(c, peer, c.rank() == a, opt.lat_iters, opt.lat_warmup, opt.lat_poll);
      if (!lat) return lat.status();
      auto poll_ns = empty_poll_ns(c, peer, c.rank() == a);
      if (!poll_ns) return poll_ns.status();
      if (c.rank() == a) {
        const auto& from = devices.value()[a], to = devices.value()[b];
        const bool host = from.starts_with("cpu") && to.starts_with("cpu");
        mine.push_back({a, b, c.path(b).provider, c.path(b).reason, c.peer(b).hostname, from, to,
                        host ? "" : c.path(b).device_path, bw.value(), lat.value(), poll_ns.value(), c.path(b).eager_limit,
                        c.path(b).get_limit, c.path(b).get_from, c.path(b).eager_window, c.path(b).credit_wait.count(),
                        c.path(b).split_from, c.path(b).turns_from});
      }
    }
  }
  // Everyone's rows to rank 0 (as fixed-size records plus text).
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& f : mine)
    rows.push_back({{"from", f.from}, {"to", f.to}, {"provider", f.provider}, {"reason", f.reason},
                    {"host", f.peer_host}, {"fd", f.from_device}, {"td", f.to_device}, {"dp", f.device_path},
                    {"bw", f.bandwidth_gbps}, {"lat", f.latency_us}, {"poll", f.poll_ns}, {"eager", f.eager_limit},
                    {"get", f.get_limit}, {"gfrom", f.get_from}, {"win", f.eager_window}, {"cw", f.credit_wait_us}, {"split", f.split_from},
                    {"turns", f.turns_from}});
  std::vector<PairFigures> all;
  auto add = [&](const nlohmann::json& j) {
    for (const auto& r : j)
      all.push_back({r["from"], r["to"], r["provider"], r["reason"], r["host"], r["fd"], r["td"], r["dp"], r["bw"], r["lat"],
                     r["poll"], r["eager"], r["get"], r["gfrom"], r["win"], r["cw"], r["split"], r["turns"]});
  };
  if (c.rank() != 0) {
    std::string text = rows.dump();
    uint64_t n = text.size();
    HMC_RETURN_IF_ERROR(c.send(&n, 8, 0, kResultTag));
    HMC_RETURN_IF_ERROR(c.send(text.data(), n, 0, kResultTag));
    guard.done = true;
    return all;
  }
  add(rows);
  for (int r = 1; r < c.size(); ++r) {
    uint64_t n = 0;
    HMC_RETURN_IF_ERROR(c.recv(&n, 8, r, kResultTag));
    std::string text(n, '\0');
    HMC_RETURN_IF_ERROR(c.recv(text.data(), n, r, kResultTag));
    add(nlohmann::json::parse(text));
  }
  guard.done = true;
  return all;
}

}  // namespace hmc::probe
