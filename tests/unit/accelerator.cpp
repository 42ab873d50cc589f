// The Accelerator's user surface (accelerator.hpp): prepare's typed results, clip_grad_norm_, clip_grad_value_,
// triggers, gather_for_metrics of objects and the on_* helpers with one process.
#include "support.hpp"

#include "training_support.hpp"

#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <accel/accelerator.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

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
  static_assert(
      std::is_same_v<decltype(loader), accel::data::ShardedLoader<accel::data::TensorDataset,
                                                                  accel::data::DefaultCollate, Solo::config>>);
  CHECK(model.get() == net.get());
  CHECK(&opt.inner() == sgd.get());
  CHECK(loader.size() == 3);
  CHECK(accel::unwrap_model(model).get() == model.get());
  // One object: itself, not a tuple. An optimizer by value is moved in.
  auto lone = acc.prepare(torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1)));
  static_assert(std::is_same_v<decltype(lone), accel::AcceleratedOptimizer<torch::optim::SGD>>);

  // An optimizer over parameters of no prepared model is refused, naming the parameter.
  auto stray = at::zeros({5, 2}).set_requires_grad(true);
  CHECK_THROWS_WITH(
      acc.prepare(std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{stray}, torch::optim::SGDOptions(0.1))),
      Catch::Contains(
          "optimizer #2 holds a parameter (group 0, index 0, shape [5, 2]) that belongs to no prepared model"));
}

TEST_CASE("unwrap_model hands back a holder whose eval()/train() reach the module", "[accelerator]") {
  Net net;
  const accel::PreparedModel<Net> prepared(net, nullptr);  // unwrapping never touches the synchroniser
  static_assert(std::is_same_v<decltype(accel::unwrap_model(prepared)), Net>);
  CHECK(accel::unwrap_model(prepared).get() == net.get());
  accel::unwrap_model(prepared)->eval();
  CHECK_FALSE(net->is_training());
  accel::unwrap_model(prepared)->train();
  CHECK(net->is_training());
  prepared.unwrap()->eval();
  CHECK_FALSE(net->is_training());
  // A std::shared_ptr<Module> handle, prepared or plain, too.
  const auto shared = std::make_shared<torch::nn::LinearImpl>(2, 1);
  const accel::PreparedModel<std::shared_ptr<torch::nn::LinearImpl>> prepared_shared(shared, nullptr);
  accel::unwrap_model(prepared_shared)->eval();
  CHECK_FALSE(shared->is_training());
  accel::unwrap_model(shared)->train();
  CHECK(shared->is_training());
}

namespace {
// Compiled, not run (ZeRO needs several processes; tests/distributed runs it): prepare() takes an optimizer chosen at
// run time under ZeRO, sharded by its dynamic type (make_sharded_optimizer, unit-tested in optim/sharded.cpp).
struct ZeroOfRuntimeOptimizer : accel::Accelerator<accel::dist::from_env, accel::shard::gradients> {};
[[maybe_unused]] void zero_prepares_a_runtime_optimizer(ZeroOfRuntimeOptimizer& acc, Net net) {
  std::shared_ptr<torch::optim::Optimizer> chosen =
      std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, chosen);
  static_assert(std::is_same_v<decltype(opt), accel::AcceleratedOptimizer<torch::optim::Optimizer>>);
  (void)model;
}
}  // namespace

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

TEST_CASE("clip_grad_value_ clamps every gradient element, for a model or a list of parameters", "[accelerator]") {
  accel::ProcessState::reset();
  Solo acc;
  torch::nn::Linear lin(3, 2);
  auto model = acc.prepare(lin);
  auto fill = [&] {
    std::vector<at::Tensor> grads;
    for (auto& p : model->parameters()) {
      p.mutable_grad() = (at::arange(p.numel(), at::kFloat).reshape(p.sizes()) - 2.0) * 0.75;  // -1.5 ... 3.0
      grads.push_back(p.grad().clone());
    }
    return grads;
  };
  auto before = fill();
  acc.clip_grad_value_(model, 1.0);
  auto params = model->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(at::equal(params[i].grad(), at::clamp(before[i], -1.0, 1.0)));
  CHECK(params[0].grad().max().item<float>() == 1.0f);
  CHECK(params[0].grad().min().item<float>() == -1.0f);
  before = fill();
  acc.clip_grad_value_(std::vector<at::Tensor>{params[1]}, 0.5);  // only the listed parameters
  CHECK(at::equal(params[0].grad(), before[0]));
  CHECK(at::equal(params[1].grad(), at::clamp(before[1], -0.5, 0.5)));
}

TEST_CASE("one process: check_trigger answers the trigger set since the last check, then resets it", "[accelerator]") {
  accel::ProcessState::reset();
  Solo acc;
  CHECK(!acc.check_trigger());
  acc.set_trigger();
  acc.set_trigger();  // a flag, not a count
  CHECK(acc.check_trigger());
  CHECK(!acc.check_trigger());
  // In a loop: the step that sets it is the step that stops.
  auto loader = acc.prepare(data::DataLoader(toy_data(20), {.batch_size = 2}));
  int steps = 0;
  for (const auto& b : loader) {
    (void)b;
    if (steps == 4) acc.set_trigger();
    if (acc.check_trigger()) break;
    ++steps;
  }
  CHECK(steps == 4);
}

TEST_CASE("one process: gather_for_metrics of objects returns the batch's objects; outside a loop, the input",
          "[accelerator][gather_for_metrics]") {
  accel::ProcessState::reset();
  Solo acc;
  auto loader = acc.prepare(data::DataLoader(toy_data(7), {.batch_size = 3}));
  std::vector<std::string> seen;
  for (const auto& b : loader) {
    std::vector<std::string> mine;
    for (int64_t i = 0; i < b.target.size(0); ++i) mine.push_back(std::to_string(b.target[i].item<int64_t>()));
    const auto g = acc.gather_for_metrics(mine);
    static_assert(std::is_same_v<std::remove_const_t<decltype(g)>, std::vector<std::string>>);
    CHECK(g == mine);
    seen.insert(seen.end(), g.begin(), g.end());
    // One object per sample of the batch: another count is refused, naming both.
    const auto rows = b.target.size(0);
    CHECK_THROWS_WITH(
        acc.gather_for_metrics(std::vector<int>(std::size_t(rows + 1))),
        Catch::Contains("passes " + std::to_string(rows + 1) + " objects but its batch has " + std::to_string(rows)));
  }
  CHECK(seen.size() == 7);
  CHECK((acc.gather_for_metrics(std::vector<int>{4, 5}) == std::vector<int>{4, 5}));
}

TEST_CASE("one process: the on_* helpers run the callable and return its result; a bad index is refused",
          "[accelerator]") {
  accel::ProcessState::reset();
  Solo acc;
  CHECK(acc.is_last_process());
  CHECK(acc.local_process_index() == 0);
  int ran = 0;
  CHECK(acc.on_main_process([&] { ++ran; }));
  CHECK(acc.on_local_main_process([&] { ++ran; }));
  CHECK(acc.on_last_process([&] { ++ran; }));
  CHECK(acc.on_process(0, [&] { ++ran; }));
  CHECK(acc.on_local_process(0, [&] { ++ran; }));
  CHECK(ran == 5);
  const std::optional<int> answer = acc.on_main_process([] { return 42; });
  CHECK(answer == 42);
  std::string text = "kept";
  const auto copy = acc.on_last_process([&]() -> const std::string& { return text; });
  static_assert(std::is_same_v<std::remove_const_t<decltype(copy)>, std::optional<std::string>>);
  CHECK(copy == "kept");
  CHECK_THROWS_WITH(acc.on_process(1, [&] { ++ran; }),
                    Catch::Contains("on_process: process index 1 is out of range: this job has 1 process, so the valid "
                                    "indices are 0 to 0; pass an index below num_processes()"));
  CHECK_THROWS_WITH(acc.on_local_process(-1, [&] { ++ran; }),
                    Catch::Contains("on_local_process: local process index -1 is out of range") &&
                        Catch::Contains("below local_num_processes()"));
  CHECK_THROWS_AS(acc.on_process(-1, [] { return 1; }), accel::InvalidArgument);
  CHECK(ran == 5);  // a refused call runs nothing
}
