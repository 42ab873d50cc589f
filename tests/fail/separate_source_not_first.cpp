// needs: torch
// flags: -DACCEL_SEPARATE_COMPILATION
// expected-error: accel: <accel/src.hpp> must come before any other accel header of its translation unit
// Another accel header first would have made the definitions invisible to src.hpp (ACCEL_DEFINITIONS 0).
#include <accel/error.hpp>

#include <accel/detail/linkage.hpp>
#include <accel/src.hpp>
