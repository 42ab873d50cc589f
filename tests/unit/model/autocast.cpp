// Autocast (model/autocast.hpp) through the Accelerator: bf16 on the CPU, nothing under Precision::no; fp16 needs a
// GPU.
#include "../support.hpp"

#include "../training_support.hpp"

#include <ATen/ops/randn.h>
#include <torch/nn/modules/linear.h>
#include <accel/accelerator.hpp>
#include <catch2/catch.hpp>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE("autocast: bf16 on the CPU under Precision::bf16, nothing under Precision::no; fp16 needs a GPU",
          "[accelerator][autocast]") {
  accel::ProcessState::reset();
  torch::nn::Linear lin(4, 2);
  const auto x = at::randn({3, 4});
  {
    Solo acc{accel::Options{.mixed_precision = accel::Precision::bf16}};
    auto ac = acc.autocast();
    CHECK(lin(x).scalar_type() == at::kBFloat16);
  }
  CHECK(lin(x).scalar_type() == at::kFloat);  // restored on exit
  {
    Solo acc;
    auto ac = acc.autocast();
    CHECK(lin(x).scalar_type() == at::kFloat);
  }
  CHECK_THROWS_WITH(Solo(accel::Options{.mixed_precision = accel::Precision::fp16}),
                    Catch::Contains("Precision::fp16 needs a GPU"));
}
