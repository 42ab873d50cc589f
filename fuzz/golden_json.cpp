// libFuzzer target: accel-plan's golden files (tools/plan/golden.hpp: read_golden, then every case recomputed).
#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return accel_fuzz::run(data, size, [](readers::Bytes b) { (void)readers::golden(b, "golden.json"); });
}
