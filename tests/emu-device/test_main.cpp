// Catch2 main of hmc-emu-device-tests; `--emu-child <role> <in> <out>` runs a child role.
#include <cstdlib>
#include <cstring>

#include "catch_run.h"
#include "emu_session.h"

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--emu-child") == 0) {
    const int in = std::atoi(argv[3]);
    const int out = std::atoi(argv[4]);
    if (std::strcmp(argv[2], "ipc") == 0) return hmc::emu_test::ipc_child(in, out);
    if (std::strcmp(argv[2], "ipc-app") == 0) return hmc::emu_test::ipc_app_child(in, out);
    return 2;
  }
  return hmc::test::run_catch(argc, argv);
}
