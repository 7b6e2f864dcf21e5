// Device test suite entry: runs only where the device provider under test is available.
//
// HMCTEST_DEVICE names it ("emu" in CI, "cuda" on a GPU machine). Where it is missing or
// unavailable the suite prints why and exits 77, which CTest reports as skipped.
#include <cstdio>
#include <cstdlib>

#include "catch_run.h"
#include "device_support.h"

int main(int argc, char** argv) {
  std::string why = hmc::test::device_unavailable_reason();
  if (!why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  return hmc::test::run_catch(argc, argv);
}
