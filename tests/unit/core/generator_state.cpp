// A generator's state as bytes (core/generator_state.hpp): round trip, and the states LibTorch would accept but
// whose mt19937 position reads past the engine's words are named.
#include <accel/core/generator_state.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {
std::vector<std::uint8_t> with_position(std::vector<std::uint8_t> b, std::int32_t left, std::uint64_t next) {
  std::memcpy(b.data() + 8, &left, sizeof left);
  std::memcpy(b.data() + 16, &next, sizeof next);
  return b;
}
}  // namespace

TEST_CASE("generator states: every state a generator reaches is accepted; a position past its words is named",
          "[core][generator]") {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  auto fresh = accel::generator_bytes(g);
  REQUIRE(fresh.size() == 5056);
  CHECK(accel::cpu_generator_state_problem(fresh).empty());  // seeded: left 1, next 0
  for (int draws = 0; draws < 3; ++draws) {
    (void)at::randperm(700, g);  // through a refill of the 624 words
    CHECK(accel::cpu_generator_state_problem(accel::generator_bytes(g)).empty());
  }
  // LibTorch's own check lets next = 624 with left = 624 through: the next draw would read word 624.
  CHECK_THAT(accel::cpu_generator_state_problem(with_position(fresh, 624, 624)),
             Catch::Contains("mt19937 position (left 624, next 624) no generator reaches"));
  CHECK_THAT(accel::cpu_generator_state_problem(with_position(fresh, 0, 0)), Catch::Contains("left 0"));
  CHECK(accel::cpu_generator_state_problem(with_position(fresh, 600, 25)).empty());
  auto unseeded = fresh;
  unseeded[12] = 0;
  CHECK_THAT(accel::cpu_generator_state_problem(unseeded), Catch::Contains("never seeded"));
  auto flag = fresh;
  flag[5052] = 7;
  CHECK_THAT(accel::cpu_generator_state_problem(flag), Catch::Contains("normal-sample flag"));
  // A state accel accepts is one LibTorch restores, and the draws continue as they were.
  const auto before = accel::generator_bytes(g);
  const auto expected = at::randperm(50, g);
  accel::set_generator_bytes(g, before);
  CHECK(at::randperm(50, g).equal(expected));
}
