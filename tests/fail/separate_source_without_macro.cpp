// needs: torch
// expected-error: accel: <accel/src.hpp> compiles accel's code for ACCEL_SEPARATE_COMPILATION; define ACCEL_SEPARATE_COMPILATION for every translation unit of the program
// The one source of the separate compilation mode, in a header-only build.
#include <accel/src.hpp>
