// libFuzzer target: accel-plan's golden files (tools/plan/golden.hpp: read_golden, then every case recomputed).
#include "common.hpp"
#include "plan/golden.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return accel_fuzz::run(data, size, [](std::span<const std::uint8_t> b) {
    const auto ref = accel_plan::read_golden(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), "golden.json");
    (void)accel_plan::check_golden(ref, "golden.json");
  });
}
