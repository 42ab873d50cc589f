// Training: the Accelerator (prepare, loop helpers, checkpoints), the gradient scaler, and gradient accumulation
// with the optimizer/scheduler wrappers against the reference table of Accelerate
// (spec 9.1: 2 processes, 3 accumulation steps, 7 batches per process, the scheduler stepped after the optimizer).
#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>
#include <accel/optim/grad_scaler.hpp>

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <catch2/catch.hpp>
#include <ATen/ops/dot.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <sstream>

namespace {
using Indices = accel::data::RangeDataset<std::vector<std::int64_t>>;
struct Acc : accel::Accelerator<accel::dist::gloo> {};

struct Row {
  std::int64_t step;
  bool sync, stepped;
  std::int64_t scheduler;
};

std::vector<Row> run(accel::AccumulationOptions acc_opt, bool split, bool step_with_optimizer) {
  std::vector<std::int64_t> v(14);
  std::iota(v.begin(), v.end(), 0);
  accel::data::DataLoader dl(Indices(v), {.batch_size = 1});
  auto loader = accel::data::prepare_data_loader<Acc::config>(dl, accel::data::PrepareContext{2, 0, nullptr});
  at::Tensor w = at::zeros({1}).set_requires_grad(true);
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  accel::AcceleratedOptimizer<torch::optim::SGD> opt(sgd);
  auto lr = std::make_shared<torch::optim::StepLR>(*sgd, 1, 0.5);
  using Sched = accel::AcceleratedScheduler<torch::optim::StepLR>;
  Sched sched(lr, {opt.record()}, Sched::Options{.num_processes = 2, .split_batches = split, .step_with_optimizer = step_with_optimizer});
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
  const auto rows = run({.steps = 3}, false, true);
  const std::vector<Row> expected{{1, false, false, 0}, {2, false, false, 0}, {3, true, true, 2}, {4, false, false, 2},
                                  {5, false, false, 2}, {6, true, true, 4}, {0, true, true, 6}};
  REQUIRE(rows.size() == expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO("batch " << i);
    CHECK(rows[i].step == expected[i].step);
    CHECK(rows[i].sync == expected[i].sync);
    CHECK(rows[i].stepped == expected[i].stepped);
    CHECK(rows[i].scheduler == expected[i].scheduler);
  }
}

TEST_CASE("accumulation variants: no sync with the loader, split batches, a scheduler on its own", "[optim][accumulate]") {
  const auto carry = run({.steps = 3, .sync_with_dataloader = false}, false, true);
  CHECK(carry.back().step == 7);
  CHECK(!carry.back().sync);
  CHECK(!carry.back().stepped);  // the partial window is carried into the next epoch
  const auto split = run({.steps = 3}, true, true);
  CHECK((split[2].scheduler == 1 && split[5].scheduler == 2 && split[6].scheduler == 3));
  const auto free = run({.steps = 3}, false, false);
  for (std::size_t i = 0; i < free.size(); ++i) CHECK(free[i].scheduler == std::int64_t(i + 1));
  const auto each = accel::Accumulation({.steps = 3, .sync_each_batch = true});
  accel::GradientState::instance().set_sync_gradients(false);
  CHECK(each.allow_sync());  // reduce every batch, step every third
  accel::GradientState::instance().set_sync_gradients(true);
  CHECK_THROWS_WITH(accel::Accumulation({.steps = 0}), Catch::Contains("gradient_accumulation_steps must be at least 1 (got 0)"));
}


// ---- the gradient scaler ----------------------------------------------------------------------------------

TEST_CASE("GradScaler: an injected inf skips the step and the scheduler, halves the scale; good steps unscale and grow it",
          "[optim][scaler]") {
  at::Tensor w = at::zeros({2}).set_requires_grad(true);
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  auto scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU), nullptr,
                                                    accel::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 2});
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
  CHECK(w[0].item<float>() == 0.0f);   // not stepped
  CHECK(sched.steps() == 0);           // nor the scheduler
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
  CHECK_THROWS_WITH(scaler->unscale_(*sgd), Catch::Contains("unscale_() was already called") && Catch::Contains("at most once per step"));
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

// ---- the Accelerator: prepare, the loop helpers, checkpoints ---------------------------------------------

namespace {
struct Solo : accel::Accelerator<accel::dist::none> {};

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(at::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Net);

accel::data::TensorDataset toy_data(std::int64_t n) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  auto x = at::randn({n, 6}, g);
  auto y = at::randint(0, 3, {n}, g);
  return {x, y};
}

template <class Holder>
std::vector<at::Tensor> snapshot_of(const Holder& net) {
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Trains Net on the toy data for `epochs` epochs with Adam, StepLR, 2-step accumulation and a shuffled loader.
// `stop_after` > 0: stop after that many batches overall and save to `save_dir`. `resume_dir`: load first.
std::vector<at::Tensor> train_toy(std::uint64_t seed, int epochs, std::int64_t stop_after, const std::string& save_dir,
                                  const std::string& resume_dir) {
  Solo acc{accel::Options{.seed = seed, .gradient_accumulation_steps = 2}};
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, opt, loader, sched] = acc.prepare(net, adam, accel::data::DataLoader(toy_data(70), {.batch_size = 8, .shuffle = true}),
                                                 std::make_shared<torch::optim::StepLR>(*adam, 3, 0.5));
  if (!resume_dir.empty()) acc.load_state(resume_dir);
  std::int64_t seen = 0;
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    for (const auto& batch : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      opt.step();
      sched.step();
      opt.zero_grad();
      if (++seen == stop_after) {
        acc.save_state(save_dir);
        return {};
      }
    }
  }
  return snapshot_of(net);
}
}  // namespace

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

TEST_CASE("accumulation over k steps equals one step on k times the data", "[accelerator][accumulate]") {
  accel::ProcessState::reset();
  const auto data = toy_data(24);
  const auto run = [&](int k, std::int64_t batch) {
    accel::set_seed(3);
    torch::nn::Linear lin(6, 3);
    Solo acc{accel::Options{.gradient_accumulation_steps = k}};
    auto [model, opt, loader] = acc.prepare(lin, std::make_shared<torch::optim::SGD>(lin->parameters(), torch::optim::SGDOptions(0.5)),
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

TEST_CASE("resume: a fresh job that loads a mid-epoch checkpoint ends bit-identical to one that never stopped", "[accelerator][checkpoint]") {
  accel::ProcessState::reset();
  const auto dir = std::filesystem::temp_directory_path() / ("accel_resume_" + std::to_string(::getpid()));
  const auto straight = train_toy(11, 4, 0, "", "");
  for (std::int64_t cut : {5, 9, 13, 27}) {  // inside the 1st, 2nd, 2nd (epoch end) and 4th epochs; odd and even steps
    INFO("checkpoint after batch " << cut);
    train_toy(11, 4, cut, dir.string(), "");
    CHECK(std::filesystem::exists(dir / "process_0.pt"));
    CHECK(!std::filesystem::exists(accel::checkpoint::partial_dir(dir)));
    const auto resumed = train_toy(99, 4, 0, "", dir.string());  // another seed: everything must come from the checkpoint
    REQUIRE(resumed.size() == straight.size());
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(at::equal(resumed[i], straight[i]));
  }
  // A job that prepared other objects is told what differs.
  {
    Solo acc;
    Net net;
    (void)acc.prepare(net);
    CHECK_THROWS_WITH(acc.load_state(dir), Catch::Contains("holds 1 optimizers, this job prepared 0") &&
                                               Catch::Contains("prepare the same objects, in the same order"));
    CHECK_THROWS_WITH(acc.load_state(dir / "nowhere"), Catch::Contains("is not a checkpoint directory"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("autocast: bf16 on the CPU under Precision::bf16, nothing under Precision::no; fp16 needs a GPU", "[accelerator][autocast]") {
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
  CHECK_THROWS_WITH(Solo(accel::Options{.mixed_precision = accel::Precision::fp16}), Catch::Contains("Precision::fp16 needs a GPU"));
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
