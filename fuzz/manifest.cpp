// libFuzzer target: the checkpoint manifest's parser (accel/checkpoint/manifest.hpp).
#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return accel_fuzz::run(data, size, [](readers::Bytes b) { readers::manifest(b, "manifest.txt"); });
}
