#include "shm/shared_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// The file mapping that covers [begin, end), joined over adjacent pieces.
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

bool find_shared_file(const void* ptr, size_t len, hmc_net::RegionFile& out) {
  const auto begin = reinterpret_cast<uint64_t>(ptr);
  if (len == 0 || begin + len < begin) return false;
  uint64_t dev = 0, ino = 0, offset = 0;
  if (!find_mapping(begin, begin + len, dev, ino, offset)) return false;
  const int fd = find_fd(dev, ino);
  if (fd < 0) return false;
  out = hmc_net::RegionFile{fd, offset, dev, ino};
  return true;
}

PeerMappings::~PeerMappings() {
  for (Entry& e : entries_) unmap(e);
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
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%" PRId64, pid, file.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    why = std::string("open ") + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != file.dev ||
      static_cast<uint64_t>(st.st_ino) != file.ino) {
    why = std::string(path) + " is no longer the file of region " + std::to_string(region);
  } else if (static_cast<uint64_t>(st.st_size) < file.offset + len) {
    why = std::string(path) + " is shorter than region " + std::to_string(region);
  } else {
    void* p = mmap(nullptr, slot->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(start));
    if (p == MAP_FAILED) {
      why = std::string("mmap of ") + path + ": " + std::strerror(errno);
    } else {
      slot->map = p;
    }
  }
  close(fd);
  return slot->map != nullptr ? static_cast<char*>(slot->map) + slot->delta : nullptr;
}

}  // namespace hmc_shm
