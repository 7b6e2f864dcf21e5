// The HMC_* settings the collectives read, parsed once per communicator: a context's
// configuration does not change after it is created, and looking them up on every call
// cost more than a small collective's own work.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/select.h"
#include "hmc/status.h"

namespace hmc::core {
class Config;
}

namespace hmc::coll {

struct CollSettings {
  std::array<Algo, kNumCollKinds> algo{};  // HMC_ALGO for each collective; kAuto: the rule
  Status algo_error;                       // a malformed HMC_ALGO fails every collective
  bool algo_set = false;                   // HMC_ALGO given: no delegation to a vendor library
  bool check = false;                      // HMC_COLL_CHECK
  std::size_t chunk = 0;                   // HMC_COLL_CHUNK
  std::size_t shm_max = 0;                 // HMC_SHM_COLL_MAX (0: no limit)
  int64_t max_chunks = 0;                  // HMC_COLL_MAX_CHUNKS
  std::string ccl;                         // HMC_CCL
  bool stream_stage = true;                // HMC_STREAM_STAGE (stream_stage.h)
  std::size_t stream_stage_max = 0;        // HMC_STREAM_STAGE_MAX

  static CollSettings read(const core::Config& cfg);
};

}  // namespace hmc::coll
