// libFuzzer target: the checkpoint manifest's parser (accel/checkpoint/manifest.hpp).
#include "common.hpp"

#include <accel/checkpoint/manifest.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return accel_fuzz::run(data, size, [](std::span<const std::uint8_t> b) {
    (void)accel::checkpoint::Manifest::parse(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), "manifest.txt");
  });
}
