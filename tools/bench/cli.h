// hmc-bench's command line (nccl-tests' flags) and how --local hands it to the ranks.
#pragma once

#include <string>
#include <vector>

#include "bench.h"

namespace hmc::bench {

struct Cli {
  Options opt;
  int local = 0;         // --local N: spawn N ranks here
  int timeout_s = 600;   // deadline of the --local ranks
};

// Parses argv; returns the exit code to stop with (0 for --help) or -1 to go on.
int parse_cli(int argc, char** argv, Cli& cli);
const char* memory_name(AllocKind k);
// The arguments a --local rank gets: the same run, as one rank.
std::vector<std::string> worker_args(const Options& opt);

}  // namespace hmc::bench
