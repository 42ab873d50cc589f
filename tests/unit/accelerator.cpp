// The Accelerator's user surface (accelerator.hpp): prepare's typed results, clip_grad_norm_.
#include "support.hpp"

#include "training_support.hpp"

#include <accel/accelerator.hpp>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <catch2/catch.hpp>
#include <cmath>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE("prepare: typed results in argument order; dist::none hands the model back unwrapped", "[accelerator]") {
  accel::ProcessState::reset();
  Solo acc;
  Net net;
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto sched = std::make_shared<torch::optim::StepLR>(*sgd, 1);
  accel::data::DataLoader dl(toy_data(10), {.batch_size = 4});
  auto [s, loader, model, opt] = acc.prepare(sched, dl, net, sgd);
  static_assert(std::is_same_v<decltype(model), Net>);  // compiled away: the user's own holder
  static_assert(std::is_same_v<decltype(opt), accel::AcceleratedOptimizer<torch::optim::SGD>>);
  static_assert(std::is_same_v<decltype(s), accel::AcceleratedScheduler<torch::optim::StepLR>>);
  static_assert(std::is_same_v<decltype(loader), accel::data::ShardedLoader<accel::data::TensorDataset, accel::data::DefaultCollate, Solo::config>>);
  CHECK(model.get() == net.get());
  CHECK(&opt.inner() == sgd.get());
  CHECK(loader.size() == 3);
  CHECK(&accel::unwrap_model(model) == &model);
  // One object: itself, not a tuple. An optimizer by value is moved in.
  auto lone = acc.prepare(torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1)));
  static_assert(std::is_same_v<decltype(lone), accel::AcceleratedOptimizer<torch::optim::SGD>>);

  // An optimizer over parameters of no prepared model is refused, naming the parameter.
  auto stray = at::zeros({5, 2}).set_requires_grad(true);
  CHECK_THROWS_WITH(acc.prepare(std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{stray}, torch::optim::SGDOptions(0.1))),
                    Catch::Contains("optimizer #2 holds a parameter (group 0, index 0, shape [5, 2]) that belongs to no prepared model"));
}

TEST_CASE("clip_grad_norm_ returns the norm before clipping and clips", "[accelerator]") {
  accel::ProcessState::reset();
  Solo acc;
  torch::nn::Linear lin(2, 1);
  auto model = acc.prepare(lin);
  for (auto& p : model->parameters()) p.mutable_grad() = at::full_like(p, 3.0);
  const double norm = acc.clip_grad_norm_(model, 1.0);
  CHECK(norm == Approx(std::sqrt(9.0 * 3)));
  double total = 0;
  for (auto& p : model->parameters()) total += p.grad().pow(2).sum().item<double>();
  CHECK(std::sqrt(total) == Approx(1.0).epsilon(1e-4));
}
