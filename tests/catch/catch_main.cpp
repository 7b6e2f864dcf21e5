// The main of the test programs that bring none of their own. It is a member of the
// static library hmc-catch, which the linker takes only where main is still undefined.
#include "catch_run.h"

int main(int argc, char** argv) { return hmc::test::run_catch(argc, argv); }
