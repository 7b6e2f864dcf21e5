// Runs Catch2's session over the command line: for test programs with a main of their own.
// Catch2 declares its Session only where its implementation is compiled (catch_impl.cpp).
#pragma once

namespace hmc::test {
int run_catch(int argc, char** argv);
}  // namespace hmc::test
