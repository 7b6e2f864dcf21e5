#include "common/sealed_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hmc_net {

int create_sealed_memfd(const char* name, uint64_t bytes, std::string& why) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    why = std::string("memfd_create: ") + std::strerror(errno);
    return -1;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    why = "ftruncate of a " + std::to_string(bytes) + "-byte memfd: " + std::strerror(errno);
  } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    why = std::string("sealing a memfd: ") + std::strerror(errno);
  } else {
    return fd;
  }
  close(fd);
  return -1;
}

bool cannot_shrink(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

std::string not_sealed(const std::string& what) {
  return what + " is not sealed against shrinking (F_SEAL_SHRINK): a mapping of it would fault if its owner shrank it";
}

}  // namespace hmc_net
