// Gradient accumulation (optim/accumulation.hpp) with the optimizer and scheduler wrappers (optim/accelerated.hpp),
// against the reference table of Accelerate (spec 9.1: 2 processes, 3 accumulation steps, 7 batches per process, the
// scheduler stepped after the optimizer); accumulating k steps equals one step on k times the data.
#include "../support.hpp"
#include "../training_support.hpp"

#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <catch2/catch.hpp>

using namespace accel_test;

namespace {
struct Row {
  std::int64_t step;
  bool sync, stepped;
  std::int64_t scheduler;
};

// Rank 0 of 2 over 14 samples, batch 1: what the accumulation, optimizer and scheduler do at every batch.
std::vector<Row> accumulation_rows(accel::AccumulationOptions acc_opt, bool split, bool step_with_optimizer) {
  accel::data::DataLoader dl(indices(14), {.batch_size = 1});
  auto loader = accel::data::prepare_data_loader<Even>(dl, accel::data::PrepareContext{2, 0, nullptr});
  at::Tensor w = at::zeros({1}).set_requires_grad(true);
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  accel::AcceleratedOptimizer<torch::optim::SGD> opt(sgd);
  auto lr = std::make_shared<torch::optim::StepLR>(*sgd, 1, 0.5);
  using Sched = accel::AcceleratedScheduler<torch::optim::StepLR>;
  Sched sched(lr, {opt.record()},
              Sched::Options{.num_processes = 2, .split_batches = split, .step_with_optimizer = step_with_optimizer});
  accel::Accumulation acc(acc_opt);
  std::vector<Row> rows;
  for (const auto& b : loader) {
    (void)b;
    const bool sync = acc.begin_step();
    w.mutable_grad() = at::ones({1});
    const float before = w.item<float>();
    opt.step();
    sched.step();
    opt.zero_grad();
    rows.push_back({acc.step(), sync, w.item<float>() != before, sched.steps()});
  }
  accel::GradientState::instance().set_sync_gradients(true);
  return rows;
}
}  // namespace

TEST_CASE("accumulation, optimizer and scheduler follow Accelerate's table", "[optim][accumulate]") {
  const auto rows = accumulation_rows({.steps = 3}, false, true);
  const std::vector<Row> expected{{1, false, false, 0}, {2, false, false, 0}, {3, true, true, 2}, {4, false, false, 2},
                                  {5, false, false, 2}, {6, true, true, 4},   {0, true, true, 6}};
  REQUIRE(rows.size() == expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO("batch " << i);
    CHECK(rows[i].step == expected[i].step);
    CHECK(rows[i].sync == expected[i].sync);
    CHECK(rows[i].stepped == expected[i].stepped);
    CHECK(rows[i].scheduler == expected[i].scheduler);
  }
}

TEST_CASE("accumulation variants: no sync with the loader, split batches, a scheduler on its own",
          "[optim][accumulate]") {
  const auto carry = accumulation_rows({.steps = 3, .sync_with_dataloader = false}, false, true);
  CHECK(carry.back().step == 7);
  CHECK(!carry.back().sync);
  CHECK(!carry.back().stepped);  // the partial window is carried into the next epoch
  const auto split = accumulation_rows({.steps = 3}, true, true);
  CHECK((split[2].scheduler == 1 && split[5].scheduler == 2 && split[6].scheduler == 3));
  const auto free = accumulation_rows({.steps = 3}, false, false);
  for (std::size_t i = 0; i < free.size(); ++i) CHECK(free[i].scheduler == std::int64_t(i + 1));
  const auto each = accel::Accumulation({.steps = 3, .sync_each_batch = true});
  accel::GradientState::instance().set_sync_gradients(false);
  CHECK(each.allow_sync());  // reduce every batch, step every third
  accel::GradientState::instance().set_sync_gradients(true);
  CHECK_THROWS_WITH(accel::Accumulation({.steps = 0}),
                    Catch::Contains("gradient_accumulation_steps must be at least 1 (got 0)"));
}

TEST_CASE("accumulation over k steps equals one step on k times the data", "[accelerator][accumulate]") {
  accel::ProcessState::reset();
  const auto data = toy_data(24);
  const auto run = [&](int k, std::int64_t batch) {
    accel::set_seed(3);
    torch::nn::Linear lin(6, 3);
    Solo acc{accel::Options{.gradient_accumulation_steps = k}};
    auto [model, opt, loader] =
        acc.prepare(lin, std::make_shared<torch::optim::SGD>(lin->parameters(), torch::optim::SGDOptions(0.5)),
                    accel::data::DataLoader(data, {.batch_size = batch}));
    int real_steps = 0;
    for (const auto& b : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model(b.data), b.target));
      real_steps += acc.sync_gradients();
      opt.step();
      opt.zero_grad();
    }
    CHECK(real_steps == 24 / (batch * k));
    return snapshot_of(lin);
  };
  const auto big = run(1, 12), small = run(4, 3);
  REQUIRE(big.size() == small.size());
  for (std::size_t i = 0; i < big.size(); ++i) CHECK(at::allclose(big[i], small[i], 0, 1e-6));
}
