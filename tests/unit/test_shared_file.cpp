// shm's lookup of the shared file behind a region (net-providers/shm/shared_file.h), by
// both readers: the PROCMAP_QUERY ioctl (where the kernel has it) and the text of
// /proc/self/maps. They must agree on every case: a shared memfd mapping and a range
// inside it, a range that runs past it, a private mapping of the same file, heap memory,
// a file without the seal against shrinking, and a mapping whose fd was closed; and a
// forked child asking about its own mapping.
// Also how an initiator reads the target's region descriptors from a shared memfd.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "shm/shared_file.h"

using hmc_shm::MapsReader;

namespace {

struct Memfd {
  int fd = -1;
  char* shared = nullptr;
  char* priv = nullptr;
  size_t bytes = 0;
  explicit Memfd(size_t n, bool sealed = true) : bytes(n) {
    fd = memfd_create("hmc-test-shared-file", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(n)) == 0);
    if (sealed) REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
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
    // A file its owner could shrink under a peer's mapping is not offered.
    Memfd unsealed(4 * page, false);
    CHECK_FALSE(hmc_shm::find_shared_file(unsealed.shared, unsealed.bytes, none, how));
  }
  // A child of this process asks about a mapping of its own: the query must read the
  // child's mappings, not those of the parent that asked before the fork.
  if (hmc_shm::has_procmap_query()) {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      alarm(20);  // never outlives the test
      const int fd = memfd_create("hmc-test-child", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      bool ok = fd >= 0 && ftruncate(fd, static_cast<off_t>(4 * page)) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0;
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

// shm checks every put against the target's table. With share_descriptors the table's
// descriptors live in a memfd that the initiator maps read-only (PeerMappings::descriptor),
// so the check is a few loads instead of a process_vm_readv: what the mapping shows must
// follow registration, deregistration and the slot's reuse, and a key that names the
// wrong file or a place outside it maps nothing.
TEST_CASE("shm reads region descriptors through a mapping of the owner's memfd", "[unit][shm]") {
  hmc_net::RegionTable table;
  std::string why;
  REQUIRE(table.share_descriptors(why));
  std::vector<char> a(4096), b(8192);
  void* ha = table.add(a.data(), a.size());
  hmc_net::RegionInfo ia;
  REQUIRE(table.info(ha, ia));
  REQUIRE(ia.desc_file.fd >= 0);
  CHECK(ftruncate(static_cast<int>(ia.desc_file.fd), 0) != 0);  // sealed: peers may map it
  CHECK(ia.desc_file.offset == ia.id * sizeof(hmc_net::RegionDesc));

  hmc_shm::PeerMappings maps;
  const hmc_net::RegionDesc* d = maps.descriptor(getpid(), ia.desc_file, why);
  INFO(why);
  REQUIRE(d != nullptr);
  CHECK(static_cast<const void*>(d) != static_cast<const void*>(ia.desc));  // another mapping of the same page
  auto words = [&] {
    return hmc_net::DescWords{d->key.load(), d->addr.load(), d->len.load(), d->file_fd.load(), d->file_offset.load(),
                              d->file_dev.load(), d->file_ino.load(), d->check.load()};
  };
  hmc_net::DescWords w = words();
  CHECK(w.key == ia.key);
  CHECK(w.addr == reinterpret_cast<uint64_t>(a.data()));
  CHECK(w.len == a.size());
  CHECK(w.check == hmc_net::desc_check(w));

  // Deregistered: the mapping shows no key; the slot reused: a fresh key, the new region.
  REQUIRE(table.remove(ha));
  CHECK(words().key == 0);
  void* hb = table.add(b.data(), b.size());
  hmc_net::RegionInfo ib;
  REQUIRE(table.info(hb, ib));
  CHECK(ib.id == ia.id);
  w = words();
  CHECK(w.key == ib.key);
  CHECK(w.key != ia.key);
  CHECK(w.len == b.size());
  CHECK(w.check == hmc_net::desc_check(w));

  // Wrong file, or outside it: nothing (the caller falls back to process_vm_readv).
  hmc_net::RegionFile past = ib.desc_file;
  past.offset = hmc_net::RegionTable::kSharedSlots * sizeof(hmc_net::RegionDesc);
  CHECK(maps.descriptor(getpid(), past, why) == nullptr);
  hmc_net::RegionFile odd = ib.desc_file;
  odd.offset += 4;
  CHECK(maps.descriptor(getpid(), odd, why) == nullptr);
  hmc_shm::PeerMappings other;
  why.clear();
  hmc_net::RegionFile forged = ib.desc_file;
  forged.ino += 1;
  CHECK(other.descriptor(getpid(), forged, why) == nullptr);
  CHECK(why.find("no longer the file") != std::string::npos);
  table.remove(hb);
}

TEST_CASE("shm's region descriptors stay private when sharing comes too late", "[unit][shm]") {
  hmc_net::RegionTable table;
  std::vector<char> a(64);
  void* h = table.add(a.data(), a.size());
  std::string why;
  CHECK_FALSE(table.share_descriptors(why));
  CHECK_FALSE(why.empty());
  hmc_net::RegionInfo info;
  REQUIRE(table.info(h, info));
  CHECK(info.desc_file.fd == -1);
  table.remove(h);
}
