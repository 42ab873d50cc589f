// Nothing silently wrong about the replicas (model/distributed_module.hpp, model/replicas.hpp, accelerator/loop.hpp):
// a forward that bypasses the prepared model's door is an error where the door matters (buffers to broadcast); an
// optimizer that accel did not prepare, stepped inside an accumulation window, is a warning on the main process;
// `backward` without `accumulate` under accumulation is a warning; and Options::check_replicas_every stops every
// rank, naming the step and the parameter, when the replicas differ.
#include "../harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace mp {
namespace replica_checks {  // named: the multi-process tests are one unity translation unit

struct Checked : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

// What this process writes to its standard error while it lives (the accelerator's warnings), read by `text()`.
class CaptureStderr {
 public:
  explicit CaptureStderr(int rank)
      : path_((std::filesystem::temp_directory_path() /
               ("accel_mp_stderr_" + std::to_string(::getpid()) + "_" + std::to_string(rank)))
                  .string()) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() { restore(); }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::string s{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::remove(path_.c_str());
    std::cerr << s;  // shown again, so that the test's log has it
    return s;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

accel::Options options_with(int accumulation, std::int64_t check_every = 0, bool broadcast_buffers = true) {
  return accel::Options{.seed = 5,
                        .gradient_accumulation_steps = accumulation,
                        .broadcast_buffers = broadcast_buffers,
                        .comm = options(60000).comm,
                        .check_replicas_every = check_every};
}
accel::data::TensorDataset toy(std::int64_t n) {
  at::manual_seed(3);  // the same data on every rank
  return accel::data::TensorDataset(at::randn({n, 4}), at::randn({n, 2}));
}

// model->forward(x) on a model with buffers: an error at the first backward, on every rank, naming the fix; with
// broadcast_buffers off (nothing to bracket) it trains; model(x) trains.
void door() {
  for (const int way : {0, 1, 2}) {  // 0: model->forward; 1: model(x); 2: model->forward without broadcast_buffers
    Checked acc{options_with(1, 0, way != 2)};
    auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                                     torch::nn::Linear(8, 2));
    auto [model, opt, loader] = acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1),
                                            accel::data::DataLoader(toy(32), {.batch_size = 4}));
    std::string error;
    std::int64_t steps = 0;
    try {
      for (const auto& b : loader) {
        auto step = acc.accumulate(model);
        const at::Tensor out = way == 1 ? model(b.data) : model->forward(b.data);
        acc.backward(torch::mse_loss(out, b.target));
        opt.step();
        opt.zero_grad();
        ++steps;
      }
    } catch (const accel::InvalidArgument& e) {
      error = e.what();
    }
    if (way == 0) {
      check(steps == 0, "model->forward(x) with buffers to broadcast: stopped at the first backward");
      check(error.find("followed a forward that did not go through it (model->forward(x)") != std::string::npos &&
                error.find("Call the prepared model itself, model(x)") != std::string::npos,
            "the error names the call and the fix: " + error);
    } else {
      check(error.empty() && steps == std::int64_t(loader.size()),
            std::string(way == 1 ? "model(x)" : "model->forward(x) without broadcast_buffers") + " trains: " + error);
    }
  }
}

// An optimizer that accel never prepared, stepped and cleared on every batch (inside the accumulation window too):
// AdamW's in-place step moves the parameters' version counters, a warning on the main process at the window's next
// backward; SGD (LibTorch's steps through `.data()`, which moves none) is found by its zero_grad, which clears the
// window's gradients. With check_replicas_every = 1 the divergence stops every rank at the first synchronising step,
// naming it and the first parameter.
void raw_optimizer(bool adamw) {
  Checked acc{options_with(2, 1)};
  CaptureStderr err(acc.process_index());
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  std::shared_ptr<torch::optim::Optimizer> raw;
  if (adamw)
    raw = std::make_shared<torch::optim::AdamW>(net->parameters(), 0.01);
  else
    raw = std::make_shared<torch::optim::SGD>(net->parameters(), 0.1);
  auto [model, loader] = acc.prepare(net, accel::data::DataLoader(toy(32), {.batch_size = 4}));
  std::string error;
  try {
    for (const auto& b : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(b.data), b.target));
      raw->step();  // the LibTorch habit: every batch, gradients synchronised or not
      raw->zero_grad();
    }
  } catch (const accel::ReplicaDivergence& e) {
    error = e.what();
  }
  const std::string log = err.text();
  const std::string which = adamw ? "AdamW: " : "SGD: ";
  if (acc.is_main_process()) {
    if (adamw)
      check(log.find("accel: warning: parameter '0.weight' of prepared model 0 changed inside an accumulation window, "
                     "where its "
                     "gradients are this process's alone, but no optimizer that prepare() returned has stepped") !=
                std::string::npos,
            which + "the main process warns about the optimizer accel did not prepare");
    check(log.find("accel: warning: the gradient of parameter '0.weight' of prepared model 0 was cleared inside an "
                   "accumulation "
                   "window") != std::string::npos,
          which + "the main process warns about the gradients cleared inside the window");
  }
  check(
      error.find(
          "the processes' replicas differ after optimizer step 1 (they were equal after step 0): parameter '0.weight' "
          "on rank(s) 1") != std::string::npos,
      which + "every rank stops at the first synchronising step, naming the parameter: " + error);
}

// The same job stepping the prepared optimizer: no warning, no divergence, equal replicas at the end; then a change
// to one parameter on the last rank only is found at the next check, on every rank.
void healthy_then_perturbed() {
  Checked acc{options_with(2, 1)};
  CaptureStderr err(acc.process_index());
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  auto [model, opt, loader] =
      acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1), accel::data::DataLoader(toy(48), {.batch_size = 4}));
  std::string error;
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    std::int64_t batches = 0;
    try {
      for (const auto& b : loader) {
        auto step = acc.accumulate(model);
        acc.backward(torch::mse_loss(model(b.data), b.target));
        opt.step();
        opt.zero_grad();
        // After the second epoch's first synchronising step: found at the step boundary that follows.
        if (epoch == 1 && ++batches == 2 && acc.is_last_process()) {
          torch::NoGradGuard g;
          net[2]->named_parameters()["bias"].add_(1e-7);  // a rank-dependent change, as a user bug would make
        }
      }
    } catch (const accel::ReplicaDivergence& e) {
      error = e.what();
    }
    if (epoch == 0) {
      check(error.empty(), "healthy training passes every check: " + error);
      const auto all = acc.comm()->all_gather(net[0]->named_parameters()["weight"].detach().contiguous());
      check(at::equal(all[0], all.back()), "the replicas are equal");
    }
  }
  const std::string log = err.text();
  check(log.find("accel: warning") == std::string::npos, "no warning when the prepared optimizer steps");
  const std::string steps = std::to_string(acc.num_processes() == 2 ? 4 : 3);  // 3 or 2 steps an epoch
  check(error.find("differ after optimizer step " + steps + " (they were equal after step " +
                   std::to_string(std::stoi(steps) - 1)) != std::string::npos,
        "the step is named: " + error);
  const std::string last = std::to_string(acc.num_processes() - 1);
  check(error.find("parameter '2.bias' on rank(s) " + last + " differs from rank 0's") != std::string::npos,
        "a change on one rank is named: " + error);
}

// backward() without accumulate() under accumulation: a warning on the main process.
void backward_without_accumulate() {
  Checked acc{options_with(2)};
  CaptureStderr err(acc.process_index());
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 2));
  auto [model, opt, loader] =
      acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1), accel::data::DataLoader(toy(16), {.batch_size = 4}));
  for (const auto& b : loader) {
    acc.backward(torch::mse_loss(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
  }
  const std::string log = err.text();
  const bool warned =
      log.find("accel: warning: gradient_accumulation_steps is 2 but backward() ran outside an accumulate() scope") !=
      std::string::npos;
  check(warned == acc.is_main_process(), "the main process warns, once, that accumulation is off without accumulate()");
}

}  // namespace replica_checks

void replicas(const Args&) {
  using namespace replica_checks;
  {
    Checked probe{options_with(1)};
    tally.rank = probe.process_index();
  }
  door();
  raw_optimizer(/*adamw=*/true);
  raw_optimizer(/*adamw=*/false);
  healthy_then_perturbed();
  backward_without_accumulate();
}

}  // namespace mp
