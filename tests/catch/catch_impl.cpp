// Catch2's own implementation, compiled once for every test program: it takes a minute
// of a CI core per copy under AddressSanitizer. The programs' sources include
// <catch2/catch.hpp> for the macros only; a program with a main of its own runs the
// session through run_catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_run.h"

int hmc::test::run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
