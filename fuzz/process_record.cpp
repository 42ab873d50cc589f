// libFuzzer target: a process record's bytes (step, generator and loader states; accel/checkpoint/format.hpp).
#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return accel_fuzz::run(data, size, [](readers::Bytes b) { readers::process_record(b, "process_0.pt"); });
}
