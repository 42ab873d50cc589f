// DistributedModule (model/distributed_module.hpp) on real processes.
#include "../harness.hpp"

#include <accel/model/distributed_module.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <string>

namespace mp {

// DistributedModule: N processes with per-process batches end with the same parameters as one process trained
// on the concatenated batches; k accumulation steps (no_sync) equal one step on k times the data; a parameter
// without gradient is named.
void distributed_module(const Args&) {
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  const std::int64_t B = 4;
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4)).ptr();
  };
  at::manual_seed(100 + tally.rank);  // different initial weights on every rank: rank 0's are broadcast
  auto net = make();
  accel::DistributedModule ddp(net, state.comm(), {.bucket_bytes = 256});  // several buckets
  check(ddp.buckets() > 1, "several gradient buckets");
  auto reference = make();
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD opt(net->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
  at::manual_seed(7);  // the same data on every rank
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = at::randn({2 * N * B, 8}), y = at::randn({2 * N * B, 4});
    // accel: two micro-batches per rank, the first one without sync, losses divided by the accumulation steps.
    opt.zero_grad();
    for (int micro = 0; micro < 2; ++micro) {
      const auto rows = x.narrow(0, (micro * N + tally.rank) * B, B),
                 target = y.narrow(0, (micro * N + tally.rank) * B, B);
      auto loss = torch::mse_loss(net->forward(rows), target) / 2;
      if (micro == 0) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    opt.step();
    // reference: one process, one step on all 2*N*B rows.
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
  double worst = 0;
  auto a = net->parameters(), b = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  check(worst < 1e-5, "parameters equal single-process training on the concatenated batches (max diff " +
                          std::to_string(worst) + ")");
  state.print("DistributedModule on ", N, " processes: max parameter difference to one process ", worst);
  // A parameter that gets no gradient.
  struct TwoHeads : torch::nn::Module {
    TwoHeads()
        : used(register_module("used", torch::nn::Linear(4, 1))),
          unused(register_module("unused", torch::nn::Linear(4, 1))) {}
    torch::nn::Linear used, unused;
  };
  auto heads = std::make_shared<TwoHeads>();
  accel::DistributedModule dh(heads, state.comm());
  std::string message;
  try {
    heads->used->forward(at::randn({2, 4})).sum().backward();
  } catch (const std::exception& e) {
    message = e.what();
  }
  check(message.find("parameter(s) unused.weight, unused.bias received no gradient") != std::string::npos,
        "a parameter without gradient is named (got: " + message.substr(0, 200) + ")");
}

}  // namespace mp
