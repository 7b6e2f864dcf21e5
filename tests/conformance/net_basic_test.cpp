// The table, init and parameters, props, and connection setup with the hello.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "net_kit.h"
#include "param_rules.h"

using namespace hmc_conformance;

TEST_CASE("net: the provider table is well formed", "[net][table]") {
  const auto paths = plugin_paths();
  REQUIRE_FALSE(paths.empty());
  for (const auto& path : paths) {
    DYNAMIC_SECTION(path) {
      void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      INFO("dlopen: " << (dl ? "ok" : dlerror()));
      REQUIRE(dl != nullptr);
      auto entry = reinterpret_cast<hmc_net_entry_v1_fn>(dlsym(dl, HMC_NET_ENTRY_V1));
      REQUIRE(entry != nullptr);
      const hmc_net_provider_t* p = entry();
      REQUIRE(p != nullptr);
      CHECK(entry() == p);
      // As short as the first v1 table (up to progress); appended functions need more.
      CHECK(p->struct_size >= offsetof(hmc_net_provider_t, mem_alloc));
      CHECK(p->abi_version == HMC_NET_ABI_VERSION);
      REQUIRE(p->name != nullptr);
      CHECK(std::string(p->name) == file_provider_name(path));

      const uint64_t known = HMC_NET_CAP_MSG | HMC_NET_CAP_PUT | HMC_NET_CAP_REMOTE |
                             HMC_NET_CAP_SAME_HOST | HMC_NET_CAP_MEM_HOST | HMC_NET_CAP_MEM_DMABUF |
                             HMC_NET_CAP_MEM_PEER | HMC_NET_CAP_SINGLE_COPY | HMC_NET_CAP_MEM_ALLOC |
                             HMC_NET_CAP_GET | HMC_NET_CAP_POLLED;
      CHECK((p->caps & ~known) == 0);
      CHECK((p->caps & (HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST)) != 0);
      CHECK((p->caps & (HMC_NET_CAP_MEM_HOST | HMC_NET_CAP_MEM_DMABUF | HMC_NET_CAP_MEM_PEER)) !=
            0);
      // libhmc's loader refuses a table without messages ("capability msg is required").
      CHECK((p->caps & HMC_NET_CAP_MSG) != 0);
      if (p->caps & HMC_NET_CAP_SINGLE_COPY) CHECK((p->caps & HMC_NET_CAP_PUT) != 0);

      // Every provider needs these; a capability bit promises its entry points.
      CHECK(p->init != nullptr);
      CHECK(p->fini != nullptr);
      CHECK(p->props != nullptr);
      CHECK(p->listen != nullptr);
      CHECK(p->close_listener != nullptr);
      CHECK(p->connect != nullptr);
      CHECK(p->conn_status != nullptr);
      CHECK(p->accept != nullptr);
      CHECK(p->close_conn != nullptr);
      CHECK(p->test != nullptr);
      CHECK(p->progress != nullptr);
      if (p->caps & HMC_NET_CAP_MSG) {
        CHECK(p->send_msg != nullptr);
        CHECK(p->recv_msg != nullptr);
      }
      if (p->caps & HMC_NET_CAP_PUT) {
        CHECK(p->reg_mem != nullptr);
        CHECK(p->dereg_mem != nullptr);
        CHECK(p->pack_rkey != nullptr);
        CHECK(p->put != nullptr);
      }
      if (p->caps & HMC_NET_CAP_MEM_ALLOC) {
        CHECK((p->caps & HMC_NET_CAP_PUT) != 0);
        REQUIRE(p->struct_size >= offsetof(hmc_net_provider_t, mem_free) + sizeof(p->mem_free));
        CHECK(p->mem_alloc != nullptr);
        CHECK(p->mem_free != nullptr);
      }
      if (p->caps & HMC_NET_CAP_GET) {
        CHECK((p->caps & HMC_NET_CAP_PUT) != 0);
        REQUIRE(p->struct_size >= offsetof(hmc_net_provider_t, get) + sizeof(p->get));
        CHECK(p->get != nullptr);
      }

      hmc::conformance::check_params(p->name, p->params, p->num_params);
      dlclose(dl);
    }
  }
}

TEST_CASE("net: init refuses malformed parameters and props are sane", "[net][init]") {
  for_each_plugin([](Session& s) {
    hmc_net_props_t props{};
    props.struct_size = sizeof(props);
    REQUIRE(s.p->props(s.state, &props) == HMC_PROV_OK);
    CHECK(props.latency_us > 0);
    CHECK(props.bandwidth_gbps > 0);
    CHECK(props.max_msg_size > 0);
    // Advice, where given, names a message size the provider carries.
    CHECK(props.eager_limit_same_host <= props.max_msg_size);
    CHECK(props.eager_limit_remote <= props.max_msg_size);
    // A second band of get advice starts above the first, which it needs.
    if (props.rndv_get_from_same_host != 0) CHECK(props.rndv_get_from_same_host > props.rndv_get_max_same_host);
    if (props.rndv_get_from_same_host != 0) CHECK(props.rndv_get_max_same_host != 0);
    if (props.rndv_get_from_remote != 0) CHECK(props.rndv_get_from_remote > props.rndv_get_max_remote);
    if (props.rndv_get_from_remote != 0) CHECK(props.rndv_get_max_remote != 0);
    // Withdrawn capabilities are the table's own, and never its messages.
    CHECK((props.caps_absent & ~s.p->caps) == 0);
    CHECK_FALSE(props.caps_absent & HMC_NET_CAP_MSG);
    CHECK((s.p->caps & ~props.caps_absent & (HMC_NET_CAP_REMOTE | HMC_NET_CAP_SAME_HOST)) != 0);

    // A host built before fields were appended passes the v1 struct: the provider answers
    // and writes nothing past it.
    alignas(hmc_net_props_t) unsigned char raw[sizeof(hmc_net_props_t) + 64];
    std::memset(raw, 0xA5, sizeof(raw));
    auto* old = reinterpret_cast<hmc_net_props_t*>(raw);
    old->struct_size = HMC_NET_PROPS_V1_SIZE;
    REQUIRE(s.p->props(s.state, old) == HMC_PROV_OK);
    CHECK(old->max_msg_size == props.max_msg_size);
    size_t touched = 0;
    for (size_t i = HMC_NET_PROPS_V1_SIZE; i < sizeof(raw); ++i) touched += raw[i] != 0xA5;
    INFO("bytes written past the v1 struct: " << touched);
    CHECK(touched == 0);

    for (size_t i = 0; i < s.p->num_params; ++i) {
      const hmc_param_t& q = s.p->params[i];
      if (std::strcmp(q.type, "string") == 0) continue;  // any text is a string
      Config config = env_config();
      config[q.name] = "not-a-value!";
      Session bad;
      bool ok = bad.open(s.path, config);
      INFO("init with " << q.name << "=not-a-value! returned " << bad.init_rc);
      CHECK_FALSE(ok);
      CHECK(bad.init_rc < 0);
      CHECK_FALSE(bad.reason.empty());
    }
  });
}

TEST_CASE("net: listen, connect and accept deliver the hello intact", "[net][connect]") {
  for_each_plugin([](Session& s) {
    char addr[HMC_NET_ADDR_MAX];
    size_t addr_len = 0;
    void* listener = nullptr;
    REQUIRE(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &listener) ==
            HMC_PROV_OK);
    CHECK(addr_len > 0);
    CHECK(addr_len <= HMC_NET_ADDR_MAX);
    void* none = nullptr;
    char hb[HMC_NET_HELLO_MAX];
    size_t hl = 0;
    CHECK(s.p->accept(s.state, listener, &none, hb, sizeof(hb), &hl) == HMC_PROV_IN_PROGRESS);

    // Three connectors with hellos of the maximum size, one byte and nothing.
    std::vector<std::vector<char>> hellos = {random_bytes(HMC_NET_HELLO_MAX, 2), {'x'}, {}};
    std::vector<void*> conns;
    for (auto& h : hellos) {
      void* c = nullptr;
      REQUIRE(s.p->connect(s.state, addr, addr_len, h.empty() ? nullptr : h.data(), h.size(), &c) ==
              HMC_PROV_OK);
      conns.push_back(c);
    }
    std::multiset<std::vector<char>> want(hellos.begin(), hellos.end()), got;
    std::vector<void*> accepted;
    for (size_t i = 0; i < hellos.size(); ++i) {
      std::vector<char> h;
      void* c = s.accept(listener, &h);
      REQUIRE(c != nullptr);
      accepted.push_back(c);
      got.insert(h);
    }
    CHECK(got == want);
    for (void* c : conns) CHECK(s.wait_connected(c) == HMC_PROV_OK);
    for (void* c : accepted) CHECK(s.p->conn_status(s.state, c) == HMC_PROV_OK);

    // A hello over the limit is refused at once.
    std::vector<char> big(HMC_NET_HELLO_MAX + 1, 'h');
    void* c = nullptr;
    CHECK(s.p->connect(s.state, addr, addr_len, big.data(), big.size(), &c) < 0);

    for (void* x : conns) CHECK(s.p->close_conn(s.state, x) == HMC_PROV_OK);
    for (void* x : accepted) CHECK(s.p->close_conn(s.state, x) == HMC_PROV_OK);
    REQUIRE(s.p->close_listener(s.state, listener) == HMC_PROV_OK);

    // Nobody listens there any more: the connection fails, within the deadline.
    c = nullptr;
    int rc = s.p->connect(s.state, addr, addr_len, "h", 1, &c);
    if (rc == HMC_PROV_OK) {
      rc = s.wait_connected(c);
      CHECK(rc < 0);
      CHECK(s.p->close_conn(s.state, c) == HMC_PROV_OK);
    } else {
      CHECK(rc < 0);
    }
  });
}

// The host reads the hello first and may refuse the connection: the provider must not
// have acted on anything else the stranger sent, the stranger's side must fail (not
// hang), and the listener must go on serving genuine peers.
TEST_CASE("net: a connection refused after its hello fails the connector; the listener goes on", "[net][connect]") {
  for_each_plugin([](Session& s) {
    if (!s.has(HMC_NET_CAP_MSG)) return;
    const Link local = listen_local(s);
    const std::vector<char> strange = {'s', 't', 'r', 'a', 'n', 'g', 'e', 'r'};
    void* stranger = nullptr;
    REQUIRE(s.p->connect(s.state, local.addr.data(), local.addr.size(), strange.data(), strange.size(),
                         &stranger) == HMC_PROV_OK);
    std::vector<char> hello;
    void* refused = s.accept(local.listener, &hello, false);
    REQUIRE(refused != nullptr);
    CHECK(hello == strange);
    CHECK(s.p->close_conn(s.state, refused) == HMC_PROV_OK);

    // The stranger learns it: its connection fails, or (where it was already up) a receive does.
    int rc = s.wait_connected(stranger);
    if (rc == HMC_PROV_OK) {
      std::vector<char> buf(64);
      void* req = nullptr;
      rc = s.p->recv_msg(s.state, stranger, buf.data(), buf.size(), &req);
      if (rc >= 0) {
        Outcome o = s.wait(req);
        CHECK_FALSE(o.timed_out);
        rc = o.rc;
      }
    }
    CHECK(rc < 0);
    CHECK(s.p->close_conn(s.state, stranger) == HMC_PROV_OK);

    // A genuine peer after it connects and talks both ways.
    const std::vector<char> genuine = random_bytes(32, 7);
    void* conn = nullptr;
    REQUIRE(s.p->connect(s.state, local.addr.data(), local.addr.size(), genuine.data(), genuine.size(), &conn) ==
            HMC_PROV_OK);
    void* kept = s.accept(local.listener, &hello);
    REQUIRE(kept != nullptr);
    CHECK(hello == genuine);
    REQUIRE(s.wait_connected(conn) == HMC_PROV_OK);
    for (auto [from, to] : {std::pair{conn, kept}, std::pair{kept, conn}}) {
      const std::vector<char> msg = random_bytes(1000, 8);
      Recv r;
      post_recv(s, to, r, msg.size());
      check_sent(s, post_send(s, from, msg), msg.size());
      check_recv(s, r, msg);
    }
    CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
    CHECK(s.p->close_conn(s.state, kept) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, local.listener) == HMC_PROV_OK);
  });
}

// A connection reads nothing past its hello until the host accepted it: a stranger that
// says hello and then streams must not make this process buffer what it sends before the
// host checked the hello. The connector's sends wait (its socket, or the ring, fills), and
// once the host accepts they arrive whole and in order. Stream providers (tcp, shm).
TEST_CASE("net: a connection the host has not accepted takes nothing past its hello", "[net][connect][held]") {
  for_each_plugin([](Session& s) {
    const std::string name = s.p->name;
    if ((name != "tcp" && name != "shm") || !s.has(HMC_NET_CAP_MSG)) return;
    const Link local = listen_local(s);
    const std::vector<char> hello = {'e', 'a', 'r', 'l', 'y'};
    void* conn = nullptr;
    REQUIRE(s.p->connect(s.state, local.addr.data(), local.addr.size(), hello.data(), hello.size(), &conn) ==
            HMC_PROV_OK);
    constexpr int kCount = 64;
    constexpr size_t kLen = 1 << 20;
    std::vector<std::vector<char>> msgs;
    std::vector<void*> sends;
    for (int i = 0; i < kCount; ++i) {
      msgs.push_back(random_bytes(kLen, 500 + i));
      sends.push_back(post_send(s, conn, msgs.back()));
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < until) {
      s.p->progress(s.state);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int sent = 0;  // in order: the first still pending ends the count
    for (; sent < kCount; ++sent) {
      Outcome o = s.wait(sends[sent], std::chrono::milliseconds(0));
      if (!o.done) break;
      CHECK(o.rc == HMC_PROV_OK);
    }
    INFO(sent << " of " << kCount << " MiB sent before the host accepted");
    CHECK(sent < 16);  // what the socket buffers and the ring hold: a few MiB

    std::vector<char> got;
    void* accepted = s.accept(local.listener, &got);
    REQUIRE(accepted != nullptr);
    CHECK(got == hello);
    for (int i = 0; i < kCount; ++i) {
      INFO("message " << i);
      Recv r;
      post_recv(s, accepted, r, kLen);
      check_recv(s, r, msgs[i]);
    }
    for (int i = sent; i < kCount; ++i) check_sent(s, sends[i], kLen);
    CHECK(s.p->close_conn(s.state, conn) == HMC_PROV_OK);
    CHECK(s.p->close_conn(s.state, accepted) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, local.listener) == HMC_PROV_OK);
  });
}

// tcp's listener and ucx's lifeline listener are open to the network: connections that
// never say hello must not pile up, or a stranger holding them open would use up this
// process's descriptors, nor keep peers out. Past a quarter of the descriptor limit (at
// least 256) waiting at once, the oldest is closed for each new one, and a peer still
// connects while the stranger holds the rest. The limit is lowered to 1024 for the test
// (256 waiting). Before, the newcomer was closed (ucx had no limit at all).
TEST_CASE("net: tcp and ucx take peers while strangers hold more idle connections than they keep", "[net][connect]") {
  for_each_plugin([](Session& s) {
    const std::string name = s.p->name;
    if (name != "tcp" && name != "ucx") return;  // the address below is their "ip:port"
    rlimit was{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0);
    rlimit low = was;
    low.rlim_cur = std::min<rlim_t>(was.rlim_cur, 1024);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
    Link local = listen_local(s);  // tcp reads its limit here, ucx at its first accept
    const std::string text(local.addr.c_str());
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(text.substr(text.rfind(':') + 1))));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    auto dial = [&] {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      REQUIRE(fd >= 0);
      REQUIRE(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0);
      return fd;
    };
    // Closed by the listener within `wait`: the read sees the end (or a reset).
    auto hung_up = [](int fd, int wait_ms) {
      pollfd p{fd, POLLIN, 0};
      char c;
      return poll(&p, 1, wait_ms) == 1 && read(fd, &c, 1) <= 0;
    };
    std::vector<int> idle;
    idle.push_back(dial());
    s.progress();  // ucx: the first accept, under the lowered limit
    for (int i = 1; i < 300; ++i) idle.push_back(dial());
    // The listener accepts in the background: the first is closed once the 257th is taken.
    bool first_closed = false;
    for (int i = 0; i < 40 && !first_closed; ++i) {
      s.progress();
      first_closed = hung_up(idle.front(), 50);
    }
    setrlimit(RLIMIT_NOFILE, &was);
    CHECK(first_closed);
    CHECK_FALSE(hung_up(idle.back(), 0));  // the newest stay
    // A peer connects while the stranger holds its connections.
    const std::vector<char> hello = {'o', 'k'};
    void* c = nullptr;
    REQUIRE(s.p->connect(s.state, local.addr.data(), local.addr.size(), hello.data(), hello.size(), &c) == HMC_PROV_OK);
    std::vector<char> got;
    void* accepted = s.accept(local.listener, &got);
    REQUIRE(accepted != nullptr);
    CHECK(got == hello);
    CHECK(s.wait_connected(c) == HMC_PROV_OK);
    for (int fd : idle) close(fd);
    CHECK(s.p->close_conn(s.state, c) == HMC_PROV_OK);
    CHECK(s.p->close_conn(s.state, accepted) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, local.listener) == HMC_PROV_OK);
  });
}

// HMC_TCP_PORT / HMC_UCX_PORT=LO-HI: each listener takes the first free port of the range, so
// several ranks of a host and several communicators of a process can share one setting
// (a single fixed port served only the first; the others lost the provider). Past the
// range, listen fails and says so.
TEST_CASE("net: tcp and ucx listeners take the free ports of a range in turn", "[net][connect]") {
  // Two adjacent ports free right now.
  uint16_t base = 0;
  for (uint16_t p = 42000 + static_cast<uint16_t>(getpid() % 2000); p < 64000 && base == 0; p += 2) {
    int fds[2] = {-1, -1};
    bool free = true;
    for (int i = 0; i < 2; ++i) {
      fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(p + i));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      free &= fds[i] >= 0 && bind(fds[i], reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0;
    }
    for (int fd : fds)
      if (fd >= 0) close(fd);
    if (free) base = p;
  }
  REQUIRE(base != 0);
  const std::string range = std::to_string(base) + "-" + std::to_string(base + 1);
  setenv("HMC_TCP_PORT", range.c_str(), 1);
  setenv("HMC_UCX_PORT", range.c_str(), 1);
  for_each_plugin([&](Session& s) {
    const std::string name = s.p->name;
    if (name != "tcp" && name != "ucx") return;
    const Link a = listen_local(s), b = listen_local(s);
    const auto port_of = [](const std::string& addr) { return std::stoi(addr.substr(addr.rfind(':') + 1)); };
    CHECK(port_of(a.addr.c_str()) == base);
    CHECK(port_of(b.addr.c_str()) == base + 1);
    char addr[HMC_NET_ADDR_MAX];
    size_t len = 0;
    void* third = nullptr;
    CHECK(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &len, &third) == HMC_PROV_ERR_UNAVAILABLE);
    // A peer reaches the second.
    const std::vector<char> hello = {'r'};
    void* c = nullptr;
    REQUIRE(s.p->connect(s.state, b.addr.data(), b.addr.size(), hello.data(), hello.size(), &c) == HMC_PROV_OK);
    std::vector<char> got;
    void* accepted = s.accept(b.listener, &got);
    REQUIRE(accepted != nullptr);
    CHECK(got == hello);
    CHECK(s.wait_connected(c) == HMC_PROV_OK);
    CHECK(s.p->close_conn(s.state, c) == HMC_PROV_OK);
    CHECK(s.p->close_conn(s.state, accepted) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, a.listener) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, b.listener) == HMC_PROV_OK);
  });
  unsetenv("HMC_TCP_PORT");
  unsetenv("HMC_UCX_PORT");
}

namespace {
// shm's message rings open in this process (memfds named hmc-ring).
int rings_open() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    n += std::filesystem::read_symlink(e.path(), ec).string().rfind("/memfd:hmc-ring", 0) == 0;
  }
  return n;
}
}  // namespace

// shm makes an accepted connection's message ring, and offers it, only once the host took
// the connection: a stranger that sends a hello gets neither a shared-memory descriptor
// of this process nor an address in it. Before, every accepted socket got one at once
// (100 strangers: 200 descriptors). Without rings (HMC_SHM_CMA=0) there is nothing to count.
TEST_CASE("net: shm makes no message ring for a connection the host has not taken", "[net][connect]") {
  for_each_plugin([](Session& s) {
    if (std::string(s.p->name) != "shm") return;
    const Link local = listen_local(s);
    const int before = rings_open();
    constexpr int kConns = 8;
    std::vector<void*> conns(kConns, nullptr);
    const std::vector<char> hello = {'h', 'i'};
    for (void*& c : conns)
      REQUIRE(s.p->connect(s.state, local.addr.data(), local.addr.size(), hello.data(), hello.size(), &c) ==
              HMC_PROV_OK);
    for (int i = 0; i < 40; ++i) {  // the hellos arrive
      s.progress();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const int untaken = rings_open() - before;  // the connectors' own
    std::vector<void*> accepted;
    for (int i = 0; i < kConns; ++i) {
      std::vector<char> got;
      accepted.push_back(s.accept(local.listener, &got));
      REQUIRE(accepted.back() != nullptr);
    }
    for (void* c : conns) CHECK(s.wait_connected(c) == HMC_PROV_OK);
    const int taken = rings_open() - before;
    INFO("rings: " << untaken << " before the host took the connections, " << taken << " after");
    CHECK(2 * untaken == taken);
    for (void* c : conns) CHECK(s.p->close_conn(s.state, c) == HMC_PROV_OK);
    for (void* c : accepted) CHECK(s.p->close_conn(s.state, c) == HMC_PROV_OK);
    CHECK(s.p->close_listener(s.state, local.listener) == HMC_PROV_OK);
  });
}
