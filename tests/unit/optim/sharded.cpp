// ZeRO over an optimizer chosen at run time (optim/sharded.hpp, make_sharded_optimizer): the dispatch on its dynamic
// type, in one process (a null communicator).
#include "../support.hpp"

#include <accel/optim/sharded.hpp>

#include <ATen/ops/zeros.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

namespace {
struct MyAdam : torch::optim::Adam {
  using torch::optim::Adam::Adam;
};
}  // namespace

TEST_CASE("make_sharded_optimizer shards a run-time optimizer of a supported type, refuses another naming it",
          "[sharded]") {
  std::vector<at::Tensor> params{at::zeros({4, 3}).set_requires_grad(true)};
  std::vector<std::shared_ptr<torch::optim::Optimizer>> supported{
      std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1)),
      std::make_shared<torch::optim::Adam>(params),
      std::make_shared<torch::optim::AdamW>(params),
      std::make_shared<torch::optim::RMSprop>(params),
      std::make_shared<torch::optim::Adagrad>(params),
  };
  for (const auto& o : supported) {
    CHECK(accel::make_sharded_optimizer(o, nullptr, 1) != nullptr);
    CHECK(accel::make_sharded_optimizer(o, nullptr, 2) != nullptr);
  }
  std::shared_ptr<torch::optim::Optimizer> lbfgs = std::make_shared<torch::optim::LBFGS>(params);
  CHECK_THROWS_AS(accel::make_sharded_optimizer(lbfgs, nullptr), accel::InvalidArgument);
  CHECK_THROWS_WITH(accel::make_sharded_optimizer(lbfgs, nullptr),
                    Catch::Contains("torch::optim::LBFGS") && Catch::Contains("SGD, Adam, AdamW, RMSprop, Adagrad"));
  // A subclass may step otherwise: only the exact types are sharded.
  std::shared_ptr<torch::optim::Optimizer> mine = std::make_shared<MyAdam>(params);
  CHECK_THROWS_WITH(accel::make_sharded_optimizer(mine, nullptr), Catch::Contains("MyAdam"));
  CHECK_THROWS_AS(accel::make_sharded_optimizer(nullptr, nullptr), accel::Error);
}
