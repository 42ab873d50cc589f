// Faults (the survivors must end with an error naming the operation and the dead rank, never hang): a peer killed
// mid-collective or mid-training, a job one process short.
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <csignal>

namespace mp {

struct Victim : accel::Accelerator<accel::dist::from_env> {};

// The last rank SIGKILLs itself inside a training loop (inside forward/backward's bucketed all-reduce).
void kill_mid_training(const Args&) {
  Victim acc{accel::Options{.comm = {.timeout = std::chrono::seconds(20), .rendezvous_timeout = std::chrono::seconds(20)}}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  at::manual_seed(1);
  auto [model, opt, loader] = acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1),
                                          accel::data::DataLoader(accel::data::TensorDataset(at::randn({400, 5}), at::randn({400, 2})),
                                                                  {.batch_size = 4, .shuffle = true}));
  int step = 0;
  for (const auto& b : loader) {
    if (++step == 5 && tally.rank == N - 1) ::raise(SIGKILL);
    auto sync = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
  }
  check(false, "survived a dead peer");
}

// The last rank SIGKILLs itself in the middle of a series of all_reduces.
void kill_mid_collective(const Args&) {
  accel::ProcessState state(options(20000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  for (int i = 0; i < 20; ++i) {
    if (i == 5 && tally.rank == N - 1) ::raise(SIGKILL);
    auto t = F({1.0f});
    state.comm()->all_reduce(t);
  }
  check(false, "survived a dead peer");
}


// Just connect: a job started one process short must fail within the rendezvous timeout, naming the missing rank.
void rendezvous(const Args& args) {
  accel::ProcessState state(options(std::stoi(arg(args, 0, "5000"))));
  tally.rank = state.process_index();
  check(true, "rendezvous");
}

}  // namespace mp
