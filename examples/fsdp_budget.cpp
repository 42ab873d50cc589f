// A model that does not fit a memory budget under DDP trains within it fully sharded (accel::shard::parameters).
//
//   build/tools/accel-launch --nproc-per-node 2 build/examples/fsdp_budget --budget-mb 100          trains
//   build/tools/accel-launch --nproc-per-node 2 build/examples/fsdp_budget --budget-mb 100 --ddp    out of memory
//
// Each process gets a budget of tensor memory, enforced as a GPU's memory is: every CPU tensor is allocated through an
// allocator that refuses an allocation past the budget (LibTorch's out-of-memory error). The model is 7 residual
// blocks x + relu(Linear(1024, 1024)(x)) and a Linear head (8.4 M parameters, 33.6 MB), trained with AdamW on 4
// batches per process. Under DDP each process holds the parameters, their gradients and two optimizer moments: its
// tensor memory peaks at 164 MB (`--budget-mb 0 --ddp`), and the first step cannot be taken in 100 MB. Fully sharded,
// with each block and the head a unit, each of 2 processes holds half of each and at most two units' full parameters
// at once: it peaks at 81 MB and trains, with the same losses as DDP. The task: regress
// tanh of a fixed random linear map of the inputs.
#include <accel/accel.hpp>

#include <ATen/ops/randn.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

// LibTorch's CPU allocation with a budget: an allocation that would take the tensor bytes alive past it is refused
// with LibTorch's out-of-memory error, as a device whose memory is full refuses it.
class BudgetAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    const std::int64_t now = live_.fetch_add(std::int64_t(n)) + std::int64_t(n);
    if (budget_ > 0 && now > budget_) {
      live_.fetch_sub(std::int64_t(n));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "fsdp_budget: allocating ", n >> 20, " MB would take this process's ",
                       "tensor memory to ", now >> 20, " MB, past its budget of ", budget_ >> 20, " MB");
    }
    std::int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    void* p = c10::alloc_cpu(n);
    sizes_ctx* ctx = new sizes_ctx{p, n};
    return {p, ctx, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void set_budget(std::int64_t bytes) { budget_ = bytes; }
  static std::int64_t peak() { return peak_.load(); }

 private:
  struct sizes_ctx {
    void* p;
    std::size_t n;
  };
  static void release(void* c) {
    auto* ctx = static_cast<sizes_ctx*>(c);
    live_.fetch_sub(std::int64_t(ctx->n));
    c10::free_cpu(ctx->p);
    delete ctx;
  }
  static inline std::atomic<std::int64_t> live_{0}, peak_{0};
  static inline std::int64_t budget_ = 0;
};

// A residual block, x + relu(fc(x)): a user module whose forward calls its child directly.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int width) : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

// depth - 1 blocks and a Linear head: `depth` Linear layers of width x width.
struct NetImpl : torch::nn::Module {
  NetImpl(int width, int depth) {
    for (int i = 0; i + 1 < depth; ++i) blocks->push_back(Block(width));
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(width, width));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& b : *blocks) x = b->as<Block>()->forward(x);
    return head(x);
  }
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

template <class Acc>
int train(Acc& acc, int width, int depth, int steps) {
  torch::manual_seed(0);
  torch::nn::Linear teacher(width, width);  // the targets: a fixed random map of the inputs
  Net net(width, depth);
  auto [model, opt] = acc.prepare(net, torch::optim::AdamW(net->parameters(), torch::optim::AdamWOptions(1e-3)));
  torch::manual_seed(1 + acc.process_index());  // each process its own batches: 4, seen in turn
  std::vector<at::Tensor> xs, ys;
  for (int b = 0; b < 4; ++b) {
    torch::NoGradGuard no_grad;
    xs.push_back(at::randn({16, width}));
    ys.push_back(torch::tanh(teacher->forward(xs.back())));
  }
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    const at::Tensor& x = xs[std::size_t(s % 4)];
    const at::Tensor& y = ys[std::size_t(s % 4)];
    const at::Tensor loss = torch::mse_loss(model(x), y);
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    last = acc.reduce(loss.detach(), accel::Reduction::mean).template item<double>();
    if (s == 0) first = last;
    acc.print("step " + std::to_string(s) + ": loss " + std::to_string(last));
  }
  acc.print("trained within the budget: loss " + std::to_string(first) + " -> " + std::to_string(last) + " after " +
            std::to_string(steps) + " steps" + ", peak tensor memory of process 0 " +
            std::to_string(BudgetAllocator::peak() >> 20) + " MB");
  return last < first ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp_budget: a model that does not fit a memory budget under DDP trains within it fully sharded"};
  int budget_mb = 100, width = 1024, depth = 8, steps = 12;
  bool ddp = false;
  app.add_option("--budget-mb", budget_mb, "tensor memory each process may hold, in MiB (0: no budget)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--width", width, "features of each Linear")->check(CLI::PositiveNumber);
  app.add_option("--depth", depth, "number of Linear layers (depth - 1 blocks and the head, each a unit)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_flag("--ddp", ddp, "train replicated (DDP) instead of fully sharded");
  CLI11_PARSE(app, argc, argv);
  // Before any tensor exists, so that every tensor of the process counts (never destroyed: LibTorch keeps calling
  // the allocator it was given until the process has ended).
  static auto* allocator = new BudgetAllocator;
  c10::SetCPUAllocator(allocator, std::numeric_limits<std::uint8_t>::max());
  BudgetAllocator::set_budget(std::int64_t(budget_mb) << 20);
  try {
    if (ddp) {
      accel::Accelerator<accel::dist::from_env> acc;
      return train(acc, width, depth, steps);
    }
    // Units: every Block (by type, as Accelerate's transformer_layer_cls_to_wrap) and the head (by name).
    accel::Accelerator<accel::dist::from_env, accel::shard::parameters> acc{
        accel::Options{.sharding = {.units = {"head"}, .unit_if = accel::unit_types<Block>()}}};
    return train(acc, width, depth, steps);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fsdp_budget: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_budget: %s\n", e.what());
    return 1;
  }
}
