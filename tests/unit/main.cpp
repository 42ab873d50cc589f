// Catch2's main, in a TU of its own so that test TUs rebuild without it.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
