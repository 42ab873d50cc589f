// SyncBatchNorm (model/sync_batch_norm.hpp) on real processes with different batch sizes per rank: the output, the
// input's gradient, the summed weight and bias gradients and the running statistics equal one process's
// BatchNorm1d on the concatenated batch; eval mode is local; convert_sync_batchnorm keeps the weights and names
// what it cannot convert.
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/model/sync_batch_norm.hpp>

#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <string>

namespace mp {
namespace {
double diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

struct Own : torch::nn::Module {
  Own() { bn = register_module("bn", torch::nn::BatchNorm1d(3)); }
  torch::nn::BatchNorm1d bn{nullptr};
};
}  // namespace

void sync_batch_norm(const Args&) {
  accel::ProcessState state(options(60000));
  tally.rank = state.process_index();
  const int N = state.num_processes(), me = tally.rank;
  const std::int64_t C = 4, L = 5;
  // Every rank's batch (3 + r rows) and output weights, known to every rank for the reference.
  std::vector<at::Tensor> xs, ws;
  std::int64_t offset = 0;
  for (int r = 0; r < N; ++r) {
    at::manual_seed(10 + r);
    xs.push_back(at::randn({3 + r, C, L}) * (1 + r) + r);
    ws.push_back(at::randn({3 + r, C, L}));
    if (r < me) offset += 3 + r;
  }
  torch::nn::BatchNorm1d reference(torch::nn::BatchNorm1dOptions(C).momentum(0.3));
  {
    torch::NoGradGuard g;
    reference->weight.copy_(at::randn({C}));
    reference->bias.copy_(at::randn({C}));
  }
  auto sync = std::static_pointer_cast<accel::SyncBatchNormImpl>(accel::convert_sync_batchnorm(reference));
  check(sync->options.momentum == 0.3 && at::equal(sync->weight, reference->weight),
        "conversion keeps the options and weights");
  accel::set_communicators(*sync, state.comm());
  for (int round = 0; round < 2; ++round) {  // twice: the running statistics accumulate
    const at::Tensor full = at::cat(xs).requires_grad_(true);
    const at::Tensor out_full = reference->forward(full);
    (out_full * at::cat(ws)).sum().backward();
    const at::Tensor x = xs[std::size_t(me)].clone().requires_grad_(true);
    const at::Tensor out = sync->forward(x);
    (out * ws[std::size_t(me)]).sum().backward();
    const std::string what = "round " + std::to_string(round) + ": ";
    check(diff(out, out_full.narrow(0, offset, 3 + me)) < 1e-5,
          what + "output equals BatchNorm on the concatenated batch");
    check(diff(x.grad(), full.grad().narrow(0, offset, 3 + me)) < 1e-5, what + "input gradient equals BatchNorm's");
    at::Tensor gw = sync->weight.grad().clone(), gb = sync->bias.grad().clone();
    state.comm()->all_reduce(gw);
    state.comm()->all_reduce(gb);
    check(diff(gw, reference->weight.grad()) < 1e-4 && diff(gb, reference->bias.grad()) < 1e-4,
          what + "weight and bias gradients, summed over the ranks, equal BatchNorm's");
    check(diff(sync->running_mean, reference->running_mean) < 1e-6 &&
              diff(sync->running_var, reference->running_var) < 1e-6,
          what + "running statistics equal BatchNorm's (momentum 0.3, unbiased variance)");
    reference->zero_grad();
    sync->zero_grad();
  }
  check(sync->num_batches_tracked.item<std::int64_t>() == 2, "batches tracked");
  sync->eval();
  reference->eval();
  {
    torch::NoGradGuard g;
    check(diff(sync->forward(xs[std::size_t(me)]), reference->forward(xs[std::size_t(me)])) < 1e-6,
          "eval mode: local, with the running statistics");
  }
  // Containers are rebuilt with the same modules; a BatchNorm inside a module of one's own is named.
  auto seq = torch::nn::Sequential(torch::nn::Linear(C, C), torch::nn::BatchNorm1d(C), torch::nn::ReLU());
  auto converted = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(accel::convert_sync_batchnorm(seq));
  check(converted && converted->size() == 3 && converted->ptr(0) == seq->ptr(0) &&
            converted->ptr(1)->as<accel::SyncBatchNormImpl>(),
        "Sequential: the BatchNorm becomes a SyncBatchNorm, the rest stays");
  // Through the Accelerator: prepare hands its processes to the SyncBatchNorm, whose statistics are then global
  // (equal on every rank without any buffer broadcast).
  struct Acc : accel::Accelerator<accel::dist::from_env> {};
  Acc acc{accel::Options{.broadcast_buffers = false}};
  auto model = acc.prepare(converted);
  converted->train();
  (void)model(at::randn({2 + me, C}) * (me + 1));
  auto& bn = *converted->ptr(1)->as<accel::SyncBatchNormImpl>();
  const auto means = acc.comm()->all_gather(bn.running_mean.contiguous());
  check(at::equal(means[0], means[std::size_t(N - 1)]),
        "prepared: the running statistics are global, equal on every rank");
  // Under uneven tails a SyncBatchNorm is refused at prepare (a rank out of batches could not join its statistics).
  struct Uneven : accel::Accelerator<accel::dist::from_env, accel::tail::uneven> {};
  std::string refused;
  try {
    Uneven uneven;
    auto again = uneven.prepare(converted);
  } catch (const accel::InvalidArgument& e) {
    refused = e.what();
  }
  check(refused.find("under accel::tail::uneven a rank out of batches cannot take part") != std::string::npos,
        "a SyncBatchNorm under tail::uneven is refused at prepare, with the fix: " + refused);
  std::string error;
  try {
    (void)accel::convert_sync_batchnorm(std::make_shared<Own>());
  } catch (const accel::InvalidArgument& e) {
    error = e.what();
  }
  check(error.find("model.bn is a BatchNorm held by a module of your own") != std::string::npos &&
            error.find("accel::SyncBatchNorm") != std::string::npos,
        "a BatchNorm held as a member is named, with the fix: " + error);
}

}  // namespace mp
