// Catch half of the net kit harness: connected pairs, message checks, the per-plugin loop,
// child processes and the program's main.
#include "net_kit.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <thread>

#include "catch_run.h"

namespace hmc_conformance {

Link listen_local(Session& s) {
  Link link;
  char addr[HMC_NET_ADDR_MAX];
  size_t addr_len = 0;
  REQUIRE(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &link.listener) ==
          HMC_PROV_OK);
  link.addr.assign(addr, addr_len);
  return link;
}

Link connect_pair(Session& a, Session& b) {
  if (&a != &b) {
    a.partner = &b;
    b.partner = &a;
  }
  Link link = listen_local(b);
  const std::vector<char> hello = random_bytes(64, 1);
  REQUIRE(a.p->connect(a.state, link.addr.data(), link.addr.size(), hello.data(), hello.size(), &link.a) ==
          HMC_PROV_OK);
  std::vector<char> got;
  link.b = b.accept(link.listener, &got);
  REQUIRE(link.b != nullptr);
  REQUIRE(got == hello);
  REQUIRE(a.wait_connected(link.a) == HMC_PROV_OK);
  return link;
}

void post_recv(Session& s, void* conn, Recv& r, size_t cap) {
  r.cap = cap;
  r.buf.assign(cap + kSlack, static_cast<char>(kPoison));
  REQUIRE(s.p->recv_msg(s.state, conn, r.buf.data(), cap, &r.req) >= 0);
  REQUIRE(r.req != nullptr);
}

void* post_send(Session& s, void* conn, const std::vector<char>& data) {
  void* req = nullptr;
  REQUIRE(s.p->send_msg(s.state, conn, data.data(), data.size(), &req) >= 0);
  REQUIRE(req != nullptr);
  return req;
}

void check_recv(Session& s, Recv& r, const std::vector<char>& want) {
  Outcome o = s.wait(r.req);
  INFO("receive of " << want.size() << " bytes: rc " << o.rc << " " << o.message);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.rc == HMC_PROV_OK);
  CHECK(o.done);
  CHECK(o.bytes == want.size());
  CHECK(first_diff(r.buf.data(), want.data(), want.size()) == want.size());
  const size_t tail = r.buf.size() - want.size();
  CHECK(first_not(r.buf.data() + want.size(), tail, kPoison) == tail);
}

void check_sent(Session& s, void* req, size_t len) {
  Outcome o = s.wait(req);
  INFO("send of " << len << " bytes: rc " << o.rc << " " << o.message);
  REQUIRE_FALSE(o.timed_out);
  CHECK(o.rc == HMC_PROV_OK);
  CHECK(o.done);
}

void for_each_plugin(const std::function<void(Session&)>& body) {
  const auto paths = plugin_paths();
  if (paths.empty()) {
    FAIL("no plugin found: set HMC_CONFORMANCE_NET_PLUGIN or build one into "
         << HMC_CONFORMANCE_PLUGIN_DIR);
  }
  for (const auto& path : paths) {
    DYNAMIC_SECTION(path) {
      Session s;
      bool ok = s.open(path);
      if (s.init_rc == HMC_PROV_ERR_UNAVAILABLE) {
        WARN(path << " is unavailable here (" << s.reason << "): skipped");
        CHECK_FALSE(s.reason.empty());
      } else {
        INFO("opening " << path << ": " << s.reason);
        REQUIRE(ok);
        INFO("plugin " << s.p->name << ", seed " << seed());
        body(s);
      }
    }
  }
}

Child::Child(const std::vector<std::string>& args) {
  // Everything exec needs is built before fork: the child only calls
  // async-signal-safe functions until execv.
  std::vector<std::string> all = {"/proc/self/exe", kChildFlag};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  const pid_t parent = getpid();
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(99);
    execv(exe, argv.data());
    _exit(98);
  }
}

Child::~Child() {
  kill();
  wait_exit(std::chrono::milliseconds(10000));
  if (!reaped_) waitpid(pid_, nullptr, 0);  // SIGKILLed: returns promptly
}

void Child::kill() {
  if (pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
}

int Child::wait_exit(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!reaped_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (r < 0 || Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

}  // namespace hmc_conformance

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], hmc_conformance::kChildFlag) == 0) {
    return hmc_conformance::child_main(argc, argv);
  }
  std::fprintf(stderr, "hmc-conformance-net: seed %llu (HMC_CONFORMANCE_SEED to repeat)\n",
               static_cast<unsigned long long>(hmc_conformance::seed()));
  return hmc::test::run_catch(argc, argv);
}
