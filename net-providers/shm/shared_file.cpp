#include "shm/shared_file.h"

#include "common/sealed_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hmc_shm {

namespace {

struct MapsLine {
  uint64_t lo = 0, hi = 0, offset = 0, inode = 0;
  unsigned major = 0, minor = 0;
  char perms[5] = {};
};

bool parse_maps_line(const char* line, MapsLine& m) {
  return std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s %" SCNx64 " %x:%x %" SCNu64, &m.lo, &m.hi,
                     m.perms, &m.offset, &m.major, &m.minor, &m.inode) == 7;
}

bool shared_writable(const MapsLine& m) {
  return m.perms[1] == 'w' && m.perms[3] == 's' && m.inode != 0;
}

// PROCMAP_QUERY (Linux 6.11, uapi linux/fs.h, absent from older headers): the mapping
// that covers one address, from /proc/self/maps without reading it as text. Reading
// the text costs tens of microseconds in a small process and milliseconds in one with
// thousands of mappings, on every registration of memory the application allocated
// itself (every rendezvous into it); the query costs a few.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr;
  uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaWritable = 0x02, kVmaShared = 0x08;

enum class Lookup { kFound, kNone, kUnsupported };

// /proc/self/maps opened once per process: opening and closing it took 3 us of the 3.4 a
// query cost. The file names the process that opened it, so a fork's child opens its own.
// Used with the lock of query_mapping held.
struct KeptMaps {
  int fd = -1;
  pid_t owner = 0;
  // The kept fd, opened when there is none (or it is the parent's). `fresh`: the kept fd
  // failed and is no longer /proc/self/maps (the application closed it and the number may
  // be another file's now): forget it, without closing, and open again. -1 where the file
  // cannot be opened.
  int get(bool fresh) {
    if (fd >= 0 && owner == getpid() && !fresh) return fd;
    if (fd >= 0 && owner != getpid()) close(fd);  // inherited from the parent: its mappings, not ours
    fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    owner = getpid();
    return fd;
  }
  // Whether the kept fd is still this process's /proc/self/maps.
  bool intact() const {
    struct stat a {}, b {};
    return fd >= 0 && owner == getpid() && fstat(fd, &a) == 0 && stat("/proc/self/maps", &b) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  }
  // The kernel has no PROCMAP_QUERY: keep no fd open for nothing.
  void drop() {
    if (fd >= 0 && owner == getpid()) close(fd);
    fd = -1;
  }
};

// The file mapping that covers [begin, end), joined over adjacent pieces, by PROCMAP_QUERY on
// `fd`. query_mapping: the same on the kept fd, once more on a fresh one if that failed.
Lookup query_one(int fd, uint64_t begin, uint64_t end, uint64_t& dev, uint64_t& ino, uint64_t& offset) {
  Lookup result = Lookup::kNone;
  uint64_t covered = begin, next_off = 0;
  while (covered < end) {
    ProcmapQuery q{};
    q.size = sizeof(q);
    q.query_addr = covered;  // query_flags 0: the mapping covering this very address
    if (ioctl(fd, kProcmapQuery, &q) != 0) {
      if (errno == ENOTTY || errno == EINVAL || errno == E2BIG || errno == EBADF) result = Lookup::kUnsupported;
      break;
    }
    const bool shared_file = (q.vma_flags & kVmaWritable) && (q.vma_flags & kVmaShared) && q.inode != 0;
    const uint64_t this_dev = makedev(q.dev_major, q.dev_minor);
    if (!shared_file) break;
    if (covered == begin) {
      dev = this_dev, ino = q.inode, offset = q.vma_offset + (begin - q.vma_start);
    } else if (q.vma_start != covered || this_dev != dev || q.inode != ino || q.vma_offset != next_off) {
      break;
    }
    next_off = q.vma_offset + (q.vma_end - q.vma_start);
    covered = q.vma_end;
  }
  if (result != Lookup::kUnsupported && covered >= end) result = Lookup::kFound;
  return result;
}

Lookup query_mapping(uint64_t begin, uint64_t end, uint64_t& dev, uint64_t& ino, uint64_t& offset) {
  static std::mutex mu;
  static KeptMaps maps;
  std::lock_guard lock(mu);
  int fd = maps.get(false);
  if (fd < 0) return Lookup::kUnsupported;
  Lookup found = query_one(fd, begin, end, dev, ino, offset);
  if (found != Lookup::kUnsupported) return found;
  // Refused on the real file: the kernel lacks the query (before Linux 6.11, Debian 12's
  // 6.1 among them). Else the fd is another file now: once more on a fresh one.
  if (!maps.intact() && (fd = maps.get(true)) >= 0) found = query_one(fd, begin, end, dev, ino, offset);
  if (found == Lookup::kUnsupported) maps.drop();
  return found;
}

// The same by reading /proc/self/maps as text (kernels before 6.11).
bool find_mapping(uint64_t begin, uint64_t end, uint64_t& dev, uint64_t& ino, uint64_t& offset) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char* line = nullptr;
  size_t cap = 0;
  bool found = false;
  uint64_t covered = 0;   // end of the mapping joined so far
  uint64_t next_off = 0;  // file offset the next piece must start at
  while (getline(&line, &cap, f) > 0) {
    MapsLine m;
    if (!parse_maps_line(line, m)) continue;
    if (!found) {
      if (begin < m.lo || begin >= m.hi) continue;
      if (!shared_writable(m)) break;
      found = true;
      dev = makedev(m.major, m.minor);
      ino = m.inode;
      offset = m.offset + (begin - m.lo);
    } else if (m.lo != covered || makedev(m.major, m.minor) != dev || m.inode != ino ||
               m.offset != next_off || !shared_writable(m)) {
      break;
    }
    covered = m.hi;
    next_off = m.offset + (m.hi - m.lo);
    if (covered >= end) break;
  }
  std::free(line);
  std::fclose(f);
  return found && covered >= end;
}

// An fd of this process open on the regular file (dev, ino), or -1.
int find_fd(uint64_t dev, uint64_t ino) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end != '\0' || fd == dirfd(dir)) continue;
    // Through the /proc link, not fstat(fd): the fd may belong to another
    // thread that closes it meanwhile (then this fails or sees another file).
    struct stat st {};
    if (fstatat(dirfd(dir), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_dev) == dev && static_cast<uint64_t>(st.st_ino) == ino) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

bool has_procmap_query() {
  static const bool works = [] {
    static const int probe = 0;
    uint64_t dev = 0, ino = 0, offset = 0;
    const auto at = reinterpret_cast<uint64_t>(&probe);
    return query_mapping(at, at + sizeof(probe), dev, ino, offset) != Lookup::kUnsupported;
  }();
  return works;
}

bool find_shared_file(const void* ptr, size_t len, hmc_net::RegionFile& out, MapsReader how) {
  const auto begin = reinterpret_cast<uint64_t>(ptr);
  if (len == 0 || begin + len < begin) return false;
  if (how == MapsReader::kAuto) how = has_procmap_query() ? MapsReader::kQuery : MapsReader::kText;
  uint64_t dev = 0, ino = 0, offset = 0;
  const bool found = how == MapsReader::kQuery
                         ? query_mapping(begin, begin + len, dev, ino, offset) == Lookup::kFound
                         : find_mapping(begin, begin + len, dev, ino, offset);
  if (!found) return false;
  const int fd = find_fd(dev, ino);
  // Peers map only files sealed against shrinking (open_peer_file): others are not offered.
  if (fd < 0 || !hmc_net::cannot_shrink(fd)) return false;
  out = hmc_net::RegionFile{fd, offset, dev, ino};
  return true;
}

PeerMappings::~PeerMappings() {
  for (Entry& e : entries_) unmap(e);
  if (descs_ != nullptr) munmap(descs_, descs_len_);
}

void PeerMappings::unmap(Entry& e) {
  if (e.map != nullptr) munmap(e.map, e.map_len);
  e.map = nullptr;
}

void PeerMappings::forget(uint64_t region, uint64_t key) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].region == region && entries_[i].key == key) {
      unmap(entries_[i]);
      entries_.erase(entries_.begin() + static_cast<long>(i));
      return;
    }
  }
}

namespace {

// The peer's file `file` opened here through /proc/<pid>/fd (same user; the kernel applies
// the ptrace access check), after checking that it is still that very file (regular, same
// device and inode), at least `least` bytes long and sealed against shrinking (a peer that
// shrank a file mapped here would make the next copy through the mapping die of SIGBUS);
// -1 with `why` otherwise.
int open_peer_file(int pid, const hmc_net::RegionFile& file, int flags, uint64_t least,
                   const std::string& what, std::string& why) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%" PRId64, pid, file.fd);
  const int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0) {
    why = std::string("open ") + path + ": " + std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != file.dev ||
      static_cast<uint64_t>(st.st_ino) != file.ino) {
    why = std::string(path) + " is no longer the file of " + what;
  } else if (static_cast<uint64_t>(st.st_size) < least) {
    why = std::string(path) + " is shorter than " + what;
  } else if (!hmc_net::cannot_shrink(fd)) {
    why = hmc_net::not_sealed(std::string(path) + " (" + what + ")");
  } else {
    return fd;
  }
  close(fd);
  return -1;
}

}  // namespace

char* PeerMappings::find_or_map(int pid, uint64_t region, uint64_t key, uint64_t len,
                                const hmc_net::RegionFile& file, std::string& why) {
  Entry* slot = nullptr;
  for (Entry& e : entries_) {
    if (e.region != region) continue;
    if (e.key == key && e.len == len && e.file == file) {
      e.used = ++clock_;
      return e.map != nullptr ? static_cast<char*>(e.map) + e.delta : nullptr;
    }
    unmap(e);  // an earlier registration of this slot: gone at the target
    slot = &e;
    break;
  }
  if (slot == nullptr) {
    if (entries_.size() < kMaxEntries) {
      slot = &entries_.emplace_back();
    } else {
      slot = &entries_.front();
      for (Entry& e : entries_) {
        if (e.used < slot->used) slot = &e;
      }
      unmap(*slot);
    }
  }
  *slot = Entry{region, key, len, file, nullptr, 0, 0, ++clock_};

  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = file.offset & ~(page - 1);
  slot->delta = static_cast<size_t>(file.offset - start);
  slot->map_len = static_cast<size_t>(slot->delta + len);
  if (file.fd < 0 || len == 0 || file.offset + len < file.offset) {
    why = "region " + std::to_string(region) + " names no shared file";
    return nullptr;
  }
  const int fd = open_peer_file(pid, file, O_RDWR, file.offset + len, "region " + std::to_string(region), why);
  if (fd < 0) return nullptr;
  void* p = mmap(nullptr, slot->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) {
    why = "mmap of region " + std::to_string(region) + ": " + std::strerror(errno);
  } else {
    slot->map = p;
  }
  close(fd);
  return slot->map != nullptr ? static_cast<char*>(slot->map) + slot->delta : nullptr;
}

const hmc_net::RegionDesc* PeerMappings::descriptor(int pid, const hmc_net::RegionFile& file, std::string& why) {
  hmc_net::RegionFile whole = file;
  whole.offset = 0;
  if (file.fd < 0 || file.offset % alignof(hmc_net::RegionDesc) != 0) return nullptr;
  if (!(whole == descs_file_)) {  // another memfd than the one mapped (or none yet)
    if (descs_ != nullptr) munmap(descs_, descs_len_);
    descs_ = nullptr;
    descs_file_ = whole;
    const int fd = open_peer_file(pid, whole, O_RDONLY, 0, "the region descriptors", why);
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
      void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        descs_ = p;
        descs_len_ = static_cast<size_t>(st.st_size);
      } else {
        why = std::string("mmap of the region descriptors: ") + std::strerror(errno);
      }
    }
    if (fd >= 0) close(fd);
  }
  if (descs_ == nullptr || file.offset > descs_len_ || descs_len_ - file.offset < sizeof(hmc_net::RegionDesc))
    return nullptr;
  return reinterpret_cast<const hmc_net::RegionDesc*>(static_cast<const char*>(descs_) + file.offset);
}

}  // namespace hmc_shm
