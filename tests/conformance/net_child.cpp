// Child processes of hmc-conformance-net (run as: <kit> --hmc-net-child MODE
// PLUGIN ADDR SEED). They talk to the parent only through the plugin.
//
//   stream: connects and sends kStreamMsg-byte messages until the connection
//           fails; the parent kills it mid-transfer.
//   last:   connects, takes kLastFlood 8-byte messages (all receives posted
//           at once), sends kLastCount
//           messages (net_child.h), each waited for, and finalizes the
//           provider at once, without close_conn.
//   last-exit: as last, but _exits right after the last send instead: the
//           connection ends with no fini, as when the process is killed.
//   put:    connects, receives a PutPlan (net_child.h), puts random data at
//           offset and sends a marker right behind it, puts into the other
//           region, reports; after the parent's "go" tries the other
//           region's stale key and every one-byte change of the key, reports;
//           then waits for the parent's "bye".
//   shrink: the region's owner: offers a region in a shared file without seals,
//           checks the parent's put into it, shrinks the file to nothing and
//           says so (ShrinkKey, net_child.h); then waits for the parent's "bye".
#include "net_child.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "net_kit.h"

namespace hmc_conformance {

namespace {

int fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "conformance child %d: %s %s\n", getpid(), what, detail.c_str());
  return 2;
}

// Sends and waits; returns the result code.
int send_wait(Session& s, void* conn, const void* buf, size_t len) {
  void* req = nullptr;
  int rc = s.p->send_msg(s.state, conn, buf, len, &req);
  if (rc < 0) return rc;
  return s.wait(req, std::chrono::seconds(60)).rc;
}

int stream_mode(Session& s, void* conn) {
  std::vector<char> msg(kStreamMsg);
  for (uint64_t i = 0;; ++i) {
    std::memset(msg.data(), static_cast<int>(i & 0xff), msg.size());
    if (send_wait(s, conn, msg.data(), msg.size()) != HMC_PROV_OK) return 0;
  }
}

int last_mode(Session& s, void* conn, bool exit_at_once) {
  std::vector<char> msg(kLastSizes[3]);
  std::vector<void*> recvs(kLastFlood);
  for (auto& q : recvs)
    if (s.p->recv_msg(s.state, conn, msg.data(), msg.size(), &q) < 0) return fail("recv_msg");
  for (auto& q : recvs)
    if (Outcome o = s.wait(q, std::chrono::seconds(60)); o.rc != HMC_PROV_OK || o.bytes != 8)
      return fail("recv", std::to_string(o.rc) + " " + o.message);
  for (int k = 0; k < kLastCount; ++k) {
    for (size_t i = 0; i < last_size(k); ++i) msg[i] = last_byte(k, i);
    if (int rc = send_wait(s, conn, msg.data(), last_size(k)); rc != HMC_PROV_OK)
      return fail("send", std::to_string(k) + ": rc " + std::to_string(rc));
  }
  if (exit_at_once) _exit(0);
  return 0;  // the Session finalizes the provider on the way out
}

// The immediate error of a put, else its request's result.
int put_rc(Session& s, void* conn, const void* src, size_t len, const uint8_t* rkey,
           size_t rkey_len, uint64_t offset) {
  void* req = nullptr;
  int rc = s.p->put(s.state, conn, src, len, nullptr, rkey, rkey_len, offset, &req);
  return rc < 0 ? rc : s.wait(req).rc;
}

int recv_wait(Session& s, void* conn, void* buf, size_t cap, size_t want) {
  void* req = nullptr;
  if (s.p->recv_msg(s.state, conn, buf, cap, &req) < 0) return HMC_PROV_ERR_INTERNAL;
  Outcome o = s.wait(req, std::chrono::seconds(60));
  if (o.rc == HMC_PROV_OK && o.bytes != want) return HMC_PROV_ERR_INTERNAL;
  return o.rc;
}

int put_mode(Session& s, void* conn) {
  PutPlan p{};
  if (int rc = recv_wait(s, conn, &p, sizeof(p), sizeof(p)))
    return fail("plan", std::to_string(rc));

  // The marker goes out right behind the put, without waiting for it: the
  // parent checks the data when the marker arrives (the ordering contract).
  PutReport report{};
  std::vector<char> data = random_bytes(p.len, kPutSalt);
  void* put_req = nullptr;
  report.put_rc = s.p->put(s.state, conn, data.data(), data.size(), nullptr, p.rkey, p.rkey_len,
                           p.offset, &put_req);
  const uint32_t marker = kMarker;
  void* marker_req = nullptr;
  int marker_rc = s.p->send_msg(s.state, conn, &marker, sizeof(marker), &marker_req);
  if (report.put_rc >= 0) report.put_rc = s.wait(put_req).rc;
  if (marker_rc < 0 || s.wait(marker_req).rc != HMC_PROV_OK) return fail("send marker");
  const std::vector<char> other = random_bytes(kOtherLen, kOtherSalt);
  report.other_rc = put_rc(s, conn, other.data(), other.size(), p.other_rkey, p.other_rkey_len, 0);
  if (int rc = send_wait(s, conn, &report, sizeof(report)); rc != HMC_PROV_OK) {
    return fail("send report", std::to_string(rc));
  }

  char go[8];
  if (int rc = recv_wait(s, conn, go, sizeof(go), 3)) return fail("go", std::to_string(rc));
  StaleReport stale{};
  stale.stale_rc = put_rc(s, conn, data.data(), 64, p.other_rkey, p.other_rkey_len, 0);
  for (uint32_t i = 0; i < p.rkey_len; ++i) {
    uint8_t changed[HMC_NET_RKEY_MAX];
    std::memcpy(changed, p.rkey, p.rkey_len);
    changed[i] ^= 0xff;
    ++stale.changed_tried;
    if (put_rc(s, conn, data.data(), 64, changed, p.rkey_len, p.region_len - 32) >= 0 &&
        stale.changed_accepted++ == 0) {
      stale.first_accepted = i;
    }
  }
  if (int rc = send_wait(s, conn, &stale, sizeof(stale)); rc != HMC_PROV_OK) {
    return fail("send stale report", std::to_string(rc));
  }
  char bye[8];
  if (int rc = recv_wait(s, conn, bye, sizeof(bye), 4)) return fail("bye", std::to_string(rc));
  return 0;
}

int shrink_mode(Session& s, void* conn) {
  SharedMem mem(kShrinkLen, kPoison, /*sealed=*/false);
  if (mem.data() == nullptr) return fail("shared memory", mem.error());
  void* mr = nullptr;
  if (int rc = s.p->reg_mem(s.state, mem.data(), mem.size(), HMC_MEM_HOST, &mr); rc != HMC_PROV_OK)
    return fail("reg_mem", std::to_string(rc));
  ShrinkKey key{};
  size_t len = 0;
  if (s.p->pack_rkey(s.state, mr, key.rkey, sizeof(key.rkey), &len) != HMC_PROV_OK || len > sizeof(key.rkey))
    return fail("pack_rkey");
  key.rkey_len = static_cast<uint32_t>(len);
  if (int rc = send_wait(s, conn, &key, sizeof(key)); rc != HMC_PROV_OK) return fail("send key", std::to_string(rc));
  uint32_t marker = 0;
  if (int rc = recv_wait(s, conn, &marker, sizeof(marker), sizeof(marker)); rc != HMC_PROV_OK || marker != kMarker)
    return fail("marker", std::to_string(rc));
  const std::vector<char> want = random_bytes(kShrinkPut, kShrinkSalt);
  if (size_t at = first_diff(mem.data(), want.data(), want.size()); at != want.size())
    return fail("the first put's data differs at byte", std::to_string(at));
  if (ftruncate(mem.fd(), 0) != 0) return fail("ftruncate");
  if (int rc = send_wait(s, conn, &marker, sizeof(marker)); rc != HMC_PROV_OK) return fail("send shrunk", std::to_string(rc));
  char bye[8];
  if (int rc = recv_wait(s, conn, bye, sizeof(bye), 4)) return fail("bye", std::to_string(rc));
  s.p->dereg_mem(s.state, mr);
  return 0;
}

}  // namespace

int child_main(int argc, char** argv) {
  if (argc != 6) return fail("usage: --hmc-net-child MODE PLUGIN ADDR SEED");
  const std::string mode = argv[2];
  setenv("HMC_CONFORMANCE_SEED", argv[5], 1);  // before the first seed(): same data as the parent
  Session s;
  if (!s.open(argv[3])) return fail("init", s.reason);
  const std::string addr = argv[4];
  const char hello[] = "conformance child";
  void* conn = nullptr;
  if (s.p->connect(s.state, addr.data(), addr.size(), hello, sizeof(hello), &conn) != HMC_PROV_OK) {
    return fail("connect", addr);
  }
  if (s.wait_connected(conn) != HMC_PROV_OK) return fail("connect", addr);
  if (mode == "stream") return stream_mode(s, conn);
  if (mode == "last" || mode == "last-exit") return last_mode(s, conn, mode == "last-exit");
  if (mode == "put") return put_mode(s, conn);
  if (mode == "shrink") return shrink_mode(s, conn);
  return fail("unknown mode", mode);
}

}  // namespace hmc_conformance
