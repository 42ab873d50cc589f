// The gradient scaler (optim/grad_scaler.hpp): overflow skips the step and the scheduler, the scale backs off and
// grows, unscale_ at most once per step, the state round-trips.
#include "../support.hpp"

#include "../training_support.hpp"

#include <ATen/ops/dot.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <catch2/catch.hpp>
#include <limits>
#include <sstream>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE(
    "GradScaler: an injected inf skips the step and the scheduler, halves the scale; good steps unscale and grow it",
    "[optim][scaler]") {
  at::Tensor w = at::zeros({2}).set_requires_grad(true);
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  auto scaler = std::make_shared<accel::GradScaler>(
      c10::Device(c10::kCPU), nullptr, accel::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 2});
  accel::AcceleratedOptimizer<torch::optim::SGD> opt(sgd, scaler);
  using Sched = accel::AcceleratedScheduler<torch::optim::StepLR>;
  Sched sched(std::make_shared<torch::optim::StepLR>(*sgd, 1, 0.5), {opt.record()}, Sched::Options{.num_processes = 1});
  const auto backward = [&](float g0, float g1) {
    // loss = g . w, so the true gradient is (g0, g1); the scaler multiplies it by the scale.
    (scaler->scale(at::dot(w, at::tensor({g0, g1})))).backward();
  };

  backward(1.0f, std::numeric_limits<float>::infinity());
  CHECK(w.grad()[0].item<float>() == 1024.0f);  // scaled
  opt.step();
  sched.step();
  CHECK(opt.step_was_skipped());
  CHECK(w[0].item<float>() == 0.0f);    // not stepped
  CHECK(sched.steps() == 0);            // nor the scheduler
  CHECK(scaler->get_scale() == 512.0);  // backoff
  opt.zero_grad();

  backward(2.0f, -4.0f);
  opt.step();
  sched.step();
  CHECK(!opt.step_was_skipped());
  CHECK(w[0].item<float>() == -2.0f);  // unscaled gradient, lr 1
  CHECK(w[1].item<float>() == 4.0f);
  CHECK(sched.steps() == 1);
  CHECK(scaler->get_scale() == 512.0);
  CHECK(scaler->growth_tracker() == 1);
  opt.zero_grad();
  backward(1.0f, 1.0f);
  opt.step();
  CHECK(scaler->get_scale() == 1024.0);  // two good steps in a row: growth
  CHECK(scaler->growth_tracker() == 0);

  // NaN counts as overflow too; unscaling twice before update is refused with the fix.
  opt.zero_grad();
  backward(std::numeric_limits<float>::quiet_NaN(), 1.0f);
  scaler->unscale_(*sgd);
  CHECK_THROWS_WITH(scaler->unscale_(*sgd),
                    Catch::Contains("unscale_() was already called") && Catch::Contains("at most once per step"));
  opt.step();
  CHECK(opt.step_was_skipped());
  CHECK(scaler->get_scale() == 512.0);

  // The state round-trips.
  torch::serialize::OutputArchive out;
  scaler->save(out);
  std::stringstream buffer;
  out.save_to(buffer);
  accel::GradScaler other(c10::Device(c10::kCPU));
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  other.load(in);
  CHECK(other.get_scale() == 512.0);
}
