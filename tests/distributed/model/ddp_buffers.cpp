// DDP's buffers (model/distributed_module.hpp, broadcast_buffers): the same BatchNorm model, data and accumulation
// as a PyTorch DistributedDataParallel job (tests/golden/generate_ddp_buffers.py) give every rank the parameters
// and buffers that job's rank has, after training (each rank's own running statistics: the last forward followed
// one under no_sync) and after evaluation (rank 0's, broadcast before it); with broadcast_buffers = false every
// rank keeps its own statistics.
#include "../harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/abs.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace mp {
namespace {

struct Ddp : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

at::Tensor doubles(const nlohmann::json& v) { return at::tensor(v.get<std::vector<double>>(), at::kDouble); }

double worst(torch::nn::Module& m, const nlohmann::json& want) {
  double w = 0;
  auto diff = [&](const std::string& name, const at::Tensor& t) {
    return (t.detach().to(at::kDouble).flatten() - doubles(want.at(name))).abs().max().template item<double>();
  };
  for (const auto& p : m.named_parameters()) w = std::max(w, diff(p.key(), p.value()));
  for (const auto& b : m.named_buffers()) w = std::max(w, diff(b.key(), b.value()));
  return w;
}

}  // namespace

void ddp_buffers(const Args& args) {
  std::ifstream in(arg(args, 0, "ddp_buffers.json"));
  const auto golden = nlohmann::json::parse(in);
  for (const bool broadcast : {true, false}) {
    Ddp acc{
        accel::Options{.gradient_accumulation_steps = 2, .broadcast_buffers = broadcast, .comm = options(60000).comm}};
    tally.rank = acc.process_index();
    const int N = acc.num_processes();
    const nlohmann::json* c = nullptr;
    for (const auto& k : golden.at("cases"))
      if (k.at("num_processes") == N) c = &k;
    if (!c) return check(false, "no golden case for " + std::to_string(N) + " processes");
    const std::int64_t B = c->at("batch_size"), steps = c->at("steps");
    auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                                     torch::nn::Linear(8, 2));
    {
      torch::NoGradGuard g;
      for (auto& p : net->named_parameters())
        p.value().copy_(doubles(c->at("initial").at(p.key())).view(p.value().sizes()));
      for (auto& b : net->named_buffers())
        b.value().copy_(doubles(c->at("initial").at(b.key())).view(b.value().sizes()));
      if (tally.rank != 0)
        for (auto& p : net->parameters()) p.add_(1.0);  // prepare broadcasts rank 0's
    }
    const at::Tensor x = doubles(c->at("x")).to(at::kFloat).view({-1, 4}),
                     y = doubles(c->at("y")).to(at::kFloat).view({-1, 2});
    const at::Tensor x_eval = doubles(c->at("x_eval")).to(at::kFloat).view({-1, 4});
    auto [model, opt, loader] =
        acc.prepare(net, torch::optim::SGD(net->parameters(), c->at("lr").get<double>()),
                    accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}));
    check(std::int64_t(loader.size()) == steps, "the golden job's batches");
    for (const auto& b : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(b.data), b.target));
      opt.step();
      opt.zero_grad();
    }
    const auto& mine = c->at("ranks").at(std::size_t(tally.rank));
    const std::string what = broadcast ? "broadcast_buffers: " : "no broadcast_buffers: ";
    if (broadcast)
      check(worst(*net, mine.at("after_training")) < 1e-6,
            what + "parameters and buffers equal the DDP job's after training");
    auto& bn = dynamic_cast<torch::nn::BatchNorm1dImpl&>(*net[1]);
    const at::Tensor trained_mean = bn.running_mean.clone();
    net->eval();
    at::Tensor out;
    {
      torch::NoGradGuard g;
      out = model(x_eval);
    }
    if (broadcast) {
      check(worst(*net, mine.at("after_evaluation")) < 1e-6,
            what + "parameters and buffers equal the DDP job's after evaluation (rank 0's statistics)");
      check((out.to(at::kDouble).flatten() - doubles(mine.at("eval_output"))).abs().max().item<double>() < 1e-6,
            what + "the evaluation's output equals the DDP job's");
    } else {
      // Every rank keeps its own statistics: evaluation changed nothing, and the ranks' statistics differ.
      check(at::equal(bn.running_mean, trained_mean), what + "evaluation kept this rank's running statistics");
      const auto all = acc.comm()->all_gather(bn.running_mean.contiguous());
      check(!at::equal(all[0], all[1]), what + "each rank keeps its own running statistics");
    }
    net->train();
  }
}

}  // namespace mp
