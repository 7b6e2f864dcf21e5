// shm's lookup of the shared file behind a region (net-providers/shm/shared_file.h), by
// both readers: the PROCMAP_QUERY ioctl (where the kernel has it) and the text of
// /proc/self/maps. They must agree on every case: a shared memfd mapping and a range
// inside it, a range that runs past it, a private mapping of the same file, heap memory,
// and a mapping whose fd was closed; and a forked child asking about its own mapping.
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "shm/shared_file.h"

using hmc_shm::MapsReader;

namespace {

struct Memfd {
  int fd = -1;
  char* shared = nullptr;
  char* priv = nullptr;
  size_t bytes = 0;
  explicit Memfd(size_t n) : bytes(n) {
    fd = memfd_create("hmc-test-shared-file", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(n)) == 0);
    shared = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    priv = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
    REQUIRE(shared != MAP_FAILED);
    REQUIRE(priv != MAP_FAILED);
  }
  ~Memfd() {
    munmap(shared, bytes);
    munmap(priv, bytes);
    if (fd >= 0) close(fd);
  }
};

}  // namespace

TEST_CASE("shm finds the shared file behind a region, by either reader", "[unit][shm]") {
  std::vector<MapsReader> readers = {MapsReader::kText, MapsReader::kAuto};
  if (hmc_shm::has_procmap_query()) readers.push_back(MapsReader::kQuery);
  else WARN("this kernel has no PROCMAP_QUERY: only the text reader is checked");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Memfd m(16 * page);
  struct stat st {};
  REQUIRE(fstat(m.fd, &st) == 0);
  std::vector<char> heap(4 * page);
  for (MapsReader how : readers) {
    INFO("reader " << static_cast<int>(how));
    hmc_net::RegionFile f;
    REQUIRE(hmc_shm::find_shared_file(m.shared, m.bytes, f, how));
    CHECK(f.fd == m.fd);
    CHECK(f.offset == 0);
    CHECK(f.ino == static_cast<uint64_t>(st.st_ino));
    CHECK(f.dev == static_cast<uint64_t>(st.st_dev));
    // A range inside: its offset in the file.
    hmc_net::RegionFile inner;
    REQUIRE(hmc_shm::find_shared_file(m.shared + 3 * page + 100, 2 * page, inner, how));
    CHECK(inner.offset == 3 * page + 100);
    CHECK(inner.fd == m.fd);
    // Past the end of the mapping, privately mapped, or not a file at all: none.
    hmc_net::RegionFile none;
    CHECK_FALSE(hmc_shm::find_shared_file(m.shared + page, m.bytes, none, how));
    CHECK_FALSE(hmc_shm::find_shared_file(m.priv, m.bytes, none, how));
    CHECK_FALSE(hmc_shm::find_shared_file(heap.data(), heap.size(), none, how));
    CHECK_FALSE(hmc_shm::find_shared_file(m.shared, 0, none, how));
  }
  // A child of this process asks about a mapping of its own: the query must read the
  // child's mappings, not those of the parent that asked before the fork.
  if (hmc_shm::has_procmap_query()) {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      alarm(20);  // never outlives the test
      const int fd = memfd_create("hmc-test-child", MFD_CLOEXEC);
      bool ok = fd >= 0 && ftruncate(fd, static_cast<off_t>(4 * page)) == 0;
      void* mine = ok ? mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      hmc_net::RegionFile f;
      ok = ok && mine != MAP_FAILED && hmc_shm::find_shared_file(mine, 4 * page, f, MapsReader::kQuery) && f.fd == fd;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // The application closes every fd it does not know (the kept maps fd among them) and the
  // numbers go to other files: the query still works. In a child, whose fds are its own.
  if (hmc_shm::has_procmap_query()) {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      alarm(20);
      hmc_net::RegionFile f;
      bool ok = hmc_shm::find_shared_file(m.shared, m.bytes, f, MapsReader::kQuery);
      for (int fd = 3; fd < 256; ++fd)
        if (fd != m.fd) close(fd);
      for (int i = 0; i < 16; ++i) (void)memfd_create("hmc-test-filler", 0);
      ok = ok && hmc_shm::find_shared_file(m.shared, m.bytes, f, MapsReader::kQuery) && f.fd == m.fd;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // With no fd open on the file, peers could not open it: none, by either reader.
  close(m.fd);
  m.fd = -1;
  for (MapsReader how : readers) {
    hmc_net::RegionFile none;
    CHECK_FALSE(hmc_shm::find_shared_file(m.shared, m.bytes, none, how));
  }
}
