// Gradient compression (model/distributed_module.hpp, CommHook): fp16 and bf16 buckets give every rank the average
// PyTorch's fp16_compress_hook / bf16_compress_hook computes (each rank's gradient cast to the wire type and
// divided by N there, summed in the wire type, cast back), computed here from every rank's local gradients;
// the bytes sent are halved.
#include "../harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/abs.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <string>

namespace mp {
namespace {
struct Hooked : accel::Accelerator<accel::dist::from_env> {};
}  // namespace

void comm_hooks(const Args&) {
  for (const auto hook : {accel::CommHook::fp16, accel::CommHook::bf16}) {
    const auto wire = hook == accel::CommHook::fp16 ? at::kHalf : at::kBFloat16;
    const std::string what = std::string(hook == accel::CommHook::fp16 ? "fp16" : "bf16") + ": ";
    Hooked acc{accel::Options{.bucket_bytes = 256, .comm_hook = hook, .comm = options(60000).comm}};
    tally.rank = acc.process_index();
    const int N = acc.num_processes();
    at::manual_seed(3);
    auto net = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
    auto local = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
    auto [model] = std::tuple{acc.prepare(net)};
    {
      torch::NoGradGuard g;
      auto dst = local->parameters();
      auto src = net->parameters();
      for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
    }
    at::manual_seed(100 + tally.rank);  // every rank its own batch
    const auto x = at::randn({8, 6}), y = at::randn({8, 3});
    acc.backward(torch::mse_loss(model(x), y));
    torch::mse_loss(local->forward(x), y).backward();  // this rank's own gradient, uncompressed
    bool exact = true, representable = true, lossy = false;
    auto got = net->parameters();
    auto mine = local->parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      const auto all = acc.comm()->all_gather(mine[i].grad().contiguous());
      at::Tensor sum;  // Gloo's order for the sum: rank by rank in the wire type
      for (const auto& g : all) {
        const auto share = g.to(wire).div_(N);
        sum = sum.defined() ? (sum + share) : share;
      }
      const auto want = sum.to(at::kFloat);
      const auto tolerance = (hook == accel::CommHook::fp16 ? 1e-3 : 8e-3) * (want.abs().max().item<double>() + 1e-6);
      exact = exact && (got[i].grad() - want).abs().max().item<double>() <= tolerance;
      representable = representable && at::equal(got[i].grad(), got[i].grad().to(wire).to(at::kFloat));
      at::Tensor fp32 = all[0] / double(N);
      for (std::size_t r = 1; r < all.size(); ++r) fp32 = fp32 + all[r] / double(N);
      lossy = lossy || !at::equal(got[i].grad(), fp32);
    }
    check(exact, what + "gradients equal the hook's average (each rank's gradient in the wire type, / N, summed)");
    check(representable, what + "gradients are values of the wire type (they travelled compressed)");
    check(lossy, what + "and differ from the uncompressed average somewhere");
    std::int64_t full = 0;
    for (const auto& p : net->parameters()) full += p.numel() * 4;
    check(model.distributed().gradient_bytes() * 2 == full, what + "half the bytes on the wire");
  }
}

}  // namespace mp
