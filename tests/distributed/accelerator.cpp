// The Accelerator (accelerator.hpp) on real processes: a training loop equals one process on the concatenated batches.
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/dot.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <limits>
#include <string>

namespace mp {

struct Trainer : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

// prepare + accumulate + backward equal one process on the concatenated batches; the scheduler steps N times per
// optimizer step; the GradScaler's overflow finding is shared by every rank.
void accelerator(const Args&) {
  Trainer acc{accel::Options{.gradient_accumulation_steps = 2, .bucket_bytes = 256,
                             .comm = {.timeout = std::chrono::seconds(30), .rendezvous_timeout = std::chrono::seconds(30)}}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  const std::int64_t B = 3, steps = 4;  // 4 optimizer steps of 2 micro-batches of B rows per process
  auto make = [] { return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)); };
  at::manual_seed(7);
  const at::Tensor x = at::randn({steps * 2 * N * B, 5}), y = at::randn({steps * 2 * N * B, 2});
  at::manual_seed(100 + tally.rank);  // different initial weights on every rank: prepare broadcasts rank 0's
  auto net = make();
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.2));
  auto [model, opt, loader, sched] = acc.prepare(net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}),
                                                 std::make_shared<torch::optim::StepLR>(*sgd, 1000));
  check(model.distributed().buckets() > 1, "several gradient buckets");
  auto reference = make();  // one process: the same start, one step on each 2*N*B consecutive rows
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD ref_opt(reference->parameters(), 0.2);
  for (std::int64_t s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x.narrow(0, s * 2 * N * B, 2 * N * B)), y.narrow(0, s * 2 * N * B, 2 * N * B)).backward();
    ref_opt.step();
  }
  int real_steps = 0;
  for (const auto& b : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    real_steps += acc.sync_gradients();
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  check(real_steps == steps, "one real optimizer step every 2 batches (" + std::to_string(real_steps) + ")");
  check(sched.steps() == steps * N, "the scheduler steps num_processes times per optimizer step");
  double worst = 0;
  auto a = net->parameters(), r = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - r[i]).abs().max().item<double>());
  check(worst < 1e-5, "prepare + accumulate + backward equal one process on the concatenated batches (max diff " + std::to_string(worst) + ")");
  acc.print("Accelerator on ", N, " processes, 2-step accumulation: max parameter difference to one process ", worst);

  // The GradScaler's overflow finding is shared: one rank's inf skips the step on every rank.
  at::Tensor w = at::zeros({2}).set_requires_grad(true);
  auto plain = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  auto scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU), acc.comm(), accel::GradScalerOptions{.init_scale = 8.0});
  accel::AcceleratedOptimizer<torch::optim::SGD> scaled(plain, scaler);
  for (int round = 0; round < 2; ++round) {
    const float g = round == 0 && tally.rank == N - 1 ? std::numeric_limits<float>::infinity() : 1.0f;
    scaler->scale(at::dot(w, at::full({2}, g))).backward();
    scaled.step();
    scaled.zero_grad();
    check(scaled.step_was_skipped() == (round == 0), "round " + std::to_string(round) + ": skipped on every rank iff a rank overflowed");
  }
  check(scaler->get_scale() == 4.0, "the scale backed off once, identically on every rank");
  check(w[0].item<float>() == -1.0f, "the finite round stepped with the unscaled gradient");

  // reduce as Accelerate: Accelerator::reduce sums by default, the module function averages; `scale` multiplies.
  const auto mine = F({float(tally.rank + 1)});
  const float sum = float(N * (N + 1) / 2);
  check(acc.reduce(mine).item<float>() == sum, "Accelerator::reduce sums by default (Accelerate's Accelerator.reduce)");
  check(accel::reduce(acc.comm(), mine).item<float>() == sum / float(N), "accel::reduce averages by default (Accelerate's reduce)");
  check(acc.reduce(mine, accel::Reduction::sum, 0.5).item<float>() == sum * 0.5f, "reduce(x, sum, scale) scales the sum");
  check(acc.reduce(mine, accel::Reduction::mean, 2.0).item<float>() == sum / float(N) * 2.0f, "reduce(x, mean, scale) scales the mean");
  check(acc.reduce(mine, accel::Reduction::max, 3.0).item<float>() == float(N) * 3.0f, "reduce(x, max, scale) scales the max");
}

}  // namespace mp
