#include "eager_check.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace hmc::test {

int check_send_before_receive(RankEnv& e, std::size_t bytes, bool eager, uint8_t* into) {
  constexpr uint64_t kDataTag = 7, kGoTag = 8;
  auto data = random_bytes(bytes, bytes + (eager ? 1 : 0));
  char go = 1;
  if (e.rank == 0) {
    Request send = e.comm.isend(data.data(), bytes, 1, kDataTag);
    Status early = send.wait(std::chrono::milliseconds(eager ? 5000 : 300));
    HMC_EXPECT(early.ok() == eager, std::to_string(bytes) + " B sent before its receive was posted: " +
                                        early.to_string() + (eager ? " (should be eager)" : " (should wait)"));
    HMC_EXPECT_OK(e.comm.send(&go, 1, 1, kGoTag));
    HMC_EXPECT_OK(send.wait());
    return 0;
  }
  std::vector<uint8_t> own;
  if (!into) {
    own.resize(bytes);
    into = own.data();
  }
  std::memset(into, 0xEE, bytes);
  HMC_EXPECT_OK(e.comm.recv(&go, 1, 0, kGoTag));
  HMC_EXPECT_OK(e.comm.recv(into, bytes, 0, kDataTag));
  HMC_EXPECT(std::memcmp(into, data.data(), bytes) == 0, std::to_string(bytes) + " B: data differs");
  return 0;
}

}  // namespace hmc::test
