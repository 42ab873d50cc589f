#pragma once
// Shared by the libFuzzer targets and the seed generator: the readers (tests/support/readers.hpp, the same the
// ctest campaign runs), and the one outcome a reader may have besides success (accel::FileError). Any other
// exception escapes LLVMFuzzerTestOneInput, which libFuzzer reports as a crash with the input that caused it.
#include "support/readers.hpp"

#include <accel/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace accel_fuzz {

template <class Read>
int run(const std::uint8_t* data, std::size_t size, Read&& read) {
  try {
    read(std::span<const std::uint8_t>(data, size));
  } catch (const accel::FileError&) {
  }
  return 0;
}

}  // namespace accel_fuzz
