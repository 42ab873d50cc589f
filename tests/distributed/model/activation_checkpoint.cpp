// Activation checkpointing (model/activation_checkpoint.hpp) under full sharding (accel::shard::parameters) and DDP:
// a model whose blocks are checkpointed (accel::Checkpointed, with dropout) trains as the same model without
// checkpointing, step by step (losses) and in its final parameters, to 1e-6, on 2 and 3 processes (3 pads every
// unit): units named or chosen by type (unit_types sees through the wrapper), reshard_after_forward on and off,
// gradient accumulation, bf16 parameters (MixedPrecisionPolicy); each recomputation gathers its unit again inside the
// backward, and no more than two units and the root are gathered at once.
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/model/activation_checkpoint.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <vector>

namespace mp {
namespace {

using FsdpAcc = accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::shard::parameters>;
using DdpAcc = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;

// A pre-norm residual MLP block (a transformer layer's feed-forward half), with dropout.
struct RecomputedBlockImpl : torch::nn::Module {
  explicit RecomputedBlockImpl(std::int64_t d)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) { return x + drop(fc2(torch::gelu(fc1(norm(x))))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(RecomputedBlock);

constexpr int blocks = 4, width = 8;

// The same initial model either way: four blocks (checkpointed or not) and a head.
torch::nn::Sequential model(bool checkpointed) {
  torch::manual_seed(11);
  torch::nn::Sequential net;
  for (int k = 0; k < blocks; ++k) {
    RecomputedBlock b(width);
    if (checkpointed)
      net->push_back(accel::Checkpointed(b));
    else
      net->push_back(b);
  }
  net->push_back(torch::nn::Linear(width, 3));
  return net;
}

struct Run {
  std::vector<double> losses;
  at::Tensor params;                // every parameter, flattened, after training
  std::int64_t peak = 0;            // full sharding: the most bytes of full parameters gathered at once in a step
  std::int64_t after_forward = -1;  // full sharding: bytes gathered between the first forward and its backward
};

template <class Acc>
Run train(Acc& acc, torch::nn::Sequential net, int micro) {
  Run out;
  auto raw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [m, opt] = acc.prepare(net, raw);
  std::shared_ptr<accel::UnitSharder> sharder;
  if constexpr (std::is_same_v<Acc, FsdpAcc>) sharder = m.distributed().sharder();
  torch::manual_seed(31 + acc.process_index());  // the batches and the dropout masks, the same for both models
  for (int s = 0; s < 4; ++s) {
    if (sharder) sharder->reset_peak();
    for (int k = 0; k < micro; ++k) {
      const at::Tensor x = torch::randn({6, width}), y = torch::randn({6, 3});
      auto scope = acc.accumulate(m);
      const at::Tensor loss = torch::mse_loss(m(x).to(at::kFloat), y);  // (a bf16 output under mp_policy)
      if (sharder && out.after_forward < 0) out.after_forward = sharder->gathered_bytes();
      out.losses.push_back(loss.item<double>());
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
    }
    if (sharder) {
      out.peak = std::max(out.peak, sharder->peak_gathered_bytes());
      check(sharder->gathered_bytes() == 0, "nothing stays gathered after a step");
    }
  }
  const auto full = acc.gather_parameters(m);
  std::vector<at::Tensor> flat;
  for (const auto& p : m->parameters()) flat.push_back(p.detach().flatten().clone());
  out.params = torch::cat(flat);
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e9;
  double w = 0;
  for (std::size_t k = 0; k < a.size(); ++k) w = std::max(w, std::abs(a[k] - b[k]));
  return w;
}

void same_training(const Run& plain, const Run& ckpt, const std::string& what) {
  const double dl = max_diff(plain.losses, ckpt.losses);
  const double dp = (plain.params - ckpt.params).abs().max().item<double>();
  check(dl < 1e-6, what + ": every step's loss equals the model's without checkpointing (" + std::to_string(dl) + ")");
  check(dp < 1e-6,
        what + ": the trained parameters equal the model's without checkpointing (" + std::to_string(dp) + ")");
}

}  // namespace

void checkpointed_units(const Args&) {
  const auto env = accel::detect_launch_env();
  tally.rank = env.rank;
  std::vector<std::string> named;
  for (int k = 0; k < blocks; ++k) named.push_back(std::to_string(k));
  // Full sharding, each block a unit (by name), resharded after forward: the recomputation gathers it again.
  for (const bool reshard : {true, false}) {
    const accel::ShardingOptions so{.units = named, .reshard_after_forward = reshard};
    FsdpAcc a{accel::Options{.sharding = so, .comm = options(60000).comm}};
    const Run plain = train(a, model(false), 1);
    FsdpAcc b{accel::Options{.sharding = so, .comm = options(60000).comm}};
    const Run ckpt = train(b, model(true), 1);
    const std::string what = std::string("full sharding, reshard_after_forward = ") + (reshard ? "true" : "false");
    same_training(plain, ckpt, what);
    // A block's unit: LayerNorm 2 * 8, fc1 8 * 16 + 16, fc2 16 * 8 + 8 = 296 elements; the root: the head's 27.
    const int n = a.num_processes();
    const std::int64_t unit = (296 + n - 1) / n * n * 4, root = (27 + n - 1) / n * n * 4;
    if (reshard) {
      // Each block is freed after its forward and gathered again by its recomputation inside the backward.
      check(ckpt.after_forward == root, what + ": only the root stays gathered from the forward to the backward (" +
                                            std::to_string(ckpt.after_forward) + " bytes)");
      check(ckpt.peak <= root + 2 * unit,
            what + ": the root and at most two blocks gathered at once (" + std::to_string(ckpt.peak) + " bytes)");
    } else {
      check(ckpt.after_forward == root + blocks * unit, what + ": every block stays gathered until the backward");
    }
    check(ckpt.peak >= root + unit, what + ": the blocks were gathered (" + std::to_string(ckpt.peak) + " bytes)");
  }
  // Units chosen by type: unit_types<RecomputedBlock> takes each checkpointed block; with gradient accumulation.
  {
    const accel::ShardingOptions so{.unit_if = accel::unit_types<RecomputedBlock>()};
    FsdpAcc a{accel::Options{.gradient_accumulation_steps = 2, .sharding = so, .comm = options(60000).comm}};
    const Run plain = train(a, model(false), 2);
    FsdpAcc b{accel::Options{.gradient_accumulation_steps = 2, .sharding = so, .comm = options(60000).comm}};
    auto net = model(true);
    check(accel::plan_units(*net, so).size() == std::size_t(blocks), "unit_types finds the four checkpointed blocks");
    const Run ckpt = train(b, net, 2);
    same_training(plain, ckpt, "full sharding, units by type, 2 accumulation steps");
  }
  // FSDP's MixedPrecisionPolicy: bf16 gathered parameters (and inputs), fp32 reduction; the recomputation computes in
  // bf16 as the forward did.
  {
    const accel::ShardingOptions so{.units = named,
                                    .mp_policy = {.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat}};
    FsdpAcc a{accel::Options{.sharding = so, .comm = options(60000).comm}};
    const Run plain = train(a, model(false), 1);
    FsdpAcc b{accel::Options{.sharding = so, .comm = options(60000).comm}};
    const Run ckpt = train(b, model(true), 1);
    same_training(plain, ckpt, "full sharding, bf16 parameters (mp_policy)");
  }
  // DDP: the parameters' hooks run in the outer backward, as without checkpointing; and DDP equals full sharding.
  {
    DdpAcc a{accel::Options{.comm = options(60000).comm}};
    const Run plain = train(a, model(false), 1);
    DdpAcc b{accel::Options{.comm = options(60000).comm}};
    const Run ckpt = train(b, model(true), 1);
    same_training(plain, ckpt, "DDP");
    FsdpAcc c{accel::Options{.sharding = {.units = named}, .comm = options(60000).comm}};
    const Run sharded = train(c, model(true), 1);
    same_training(ckpt, sharded, "checkpointed, full sharding against DDP");
  }
}

}  // namespace mp
