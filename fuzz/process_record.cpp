// libFuzzer target: a process record's bytes (step, generator and loader states; accel/checkpoint/format.hpp).
#include "common.hpp"

#include <accel/checkpoint/format.hpp>
#include <accel/core/generator_state.hpp>

#include <ATen/CPUGeneratorImpl.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::size_t state = accel::generator_bytes(at::detail::getDefaultCPUGenerator()).size();
  return accel_fuzz::run(data, size, [](std::span<const std::uint8_t> b) {
    (void)accel::checkpoint::parse_process_record(b, "process_0.pt", state);
  });
}
