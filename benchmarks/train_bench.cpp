// Training side by side, 2 CPU processes on loopback (run under accel-launch; OMP_NUM_THREADS set by the caller):
//  1. accel's loop (prepare, accumulate, backward, bucketed all-reduce overlapping backward), random data, SGD, on
//     a compute-bound MLP of 14.7 M parameters (59 MB of gradients: 3 buckets of 25 MiB, batch 64 per process)
//     and on the main example's small MLP (batch 32), where per-step overhead dominates. Python Accelerate + DDP
//     runs the same models, data sizes and threads (benchmarks/python_train.py); scripts/bench pairs them.
//  2. How much of the gradient all-reduce is hidden behind backward: the exposed cost (backward with sync minus
//     backward without) against the same all-reduce alone. 1 - exposed / alone is the hidden fraction.
//  3. Bucketed sync (25 MiB buckets started during backward) against one flat all-reduce of all gradients after
//     backward (one bucket holding everything), whole training steps.
// Rank 0 writes its figures as JSON to argv[1].
#include "mlp.hpp"

#include <accel/accel.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <limits>

namespace {
using namespace bench;
struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

//! "large": compute-bound (the GEMMs dominate); "small": the main example's MLP, where per-step overhead dominates.
constexpr Size kLarge{"large", 64, 1024, 2048, 4, 3, 20}, kSmall{"small", 32, 64, 128, 1, 20, 300};

// Seconds per training step of `steps` steps (after `warmup`): the user's loop through an Accelerator.
double train_steps(const Size& z, std::int64_t bucket_bytes) {
  const int warmup = z.warmup, steps = z.steps;
  Acc acc{accel::Options{.bucket_bytes = bucket_bytes}};
  at::manual_seed(0);
  auto net = make_net(z);
  const auto n = std::int64_t(warmup + steps) * z.batch * acc.num_processes();
  auto [model, opt, loader] = acc.prepare(
      net, torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(1e-3)),
      accel::data::DataLoader(accel::data::TensorDataset(at::randn({n, z.inputs}), at::randint(0, kClasses, {n})),
                              {.batch_size = z.batch, .shuffle = true}));
  int i = 0;
  Clock::time_point t0;
  for (const auto& b : loader) {
    if (i++ == warmup) acc.wait_for_everyone(), t0 = Clock::now();
    auto step = acc.accumulate(model);
    acc.backward(torch::nn::functional::cross_entropy(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
  }
  acc.wait_for_everyone();
  return seconds_since(t0) / steps;
}

// (backward with sync, backward without sync, the same all-reduce alone): median seconds over `reps`.
std::tuple<double, double, double> overlap(Acc& acc, int reps) {
  at::manual_seed(0);
  auto net = make_net(kLarge);
  accel::DistributedModule ddp(net.ptr(), acc.comm());
  const auto x = at::randn({kLarge.batch, kLarge.inputs});
  const auto y = at::randint(0, kClasses, {kLarge.batch});
  std::vector<double> with, without, alone;
  for (int r = 0; r < reps + 2; ++r) {
    for (bool sync : {true, false}) {
      net->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      ddp.set_sync(sync);
      acc.wait_for_everyone();
      const auto t0 = Clock::now();
      loss.backward();
      (sync ? with : without).push_back(seconds_since(t0));
    }
    ddp.set_sync(true);
    std::vector<at::Tensor> grads;
    for (auto& p : net->parameters()) grads.push_back(p.grad().reshape({-1}));
    auto flat = at::cat(grads);
    acc.wait_for_everyone();
    const auto t0 = Clock::now();
    acc.comm()->all_reduce(flat);
    alone.push_back(seconds_since(t0));
  }
  // Drop the two warm-up rounds.
  for (auto* v : {&with, &without, &alone}) v->erase(v->begin(), v->begin() + 2);
  return {median(with), median(without), median(alone)};
}
}  // namespace

int main(int argc, char** argv) try {
  const std::string out_path = argc > 1 ? argv[1] : "train.json";
  Acc acc;
  if (acc.num_processes() < 2)
    throw accel::InvalidArgument("train_bench: run it under accel-launch --nproc-per-node 2");
  std::int64_t params = 0;
  for (const auto& p : make_net(kLarge)->parameters()) params += p.numel();
  // Alternate the two bucketings twice; keep each one's best run (the machine is shared and noisy).
  double bucketed = std::numeric_limits<double>::max(), flat = bucketed, small = bucketed;
  for (int round = 0; round < 2; ++round) {
    bucketed = std::min(bucketed, train_steps(kLarge, 25 * 1024 * 1024));
    flat = std::min(flat, train_steps(kLarge, std::numeric_limits<std::int64_t>::max()));
    small = std::min(small, train_steps(kSmall, 25 * 1024 * 1024));
  }
  const auto [with, without, alone] = overlap(acc, 15);
  const double exposed = std::max(0.0, with - without);
  if (acc.is_main_process()) {
    const double samples_per_s = double(kLarge.batch * acc.num_processes()) / bucketed;
    nlohmann::json out = {
        {"processes", acc.num_processes()},
        {"parameters", params},
        {"batch_per_process", kLarge.batch},
        {"accel_step_seconds", bucketed},
        {"small_accel_step_seconds", small},
        {"small_accel_samples_per_s", double(kSmall.batch * acc.num_processes()) / small},
        {"accel_samples_per_s", samples_per_s},
        {"flat_step_seconds", flat},
        {"backward_sync_seconds", with},
        {"backward_local_seconds", without},
        {"allreduce_alone_seconds", alone},
        {"hidden_fraction", alone > 0 ? 1.0 - std::min(1.0, exposed / alone) : 0.0},
    };
    std::ofstream(out_path) << out.dump(2);
    std::cout << "accel: " << params << " parameters, " << bucketed << " s/step (" << samples_per_s
              << " samples/s); flat all-reduce " << flat << " s/step; backward " << with << " s with sync, " << without
              << " s local; all-reduce alone " << alone << " s; small MLP " << small << " s/step; hidden "
              << 100.0 * (1.0 - std::min(1.0, exposed / alone)) << "%" << std::endl;
  }
  acc.wait_for_everyone();
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
