// Activation checkpointing (model/activation_checkpoint.hpp): a checkpointed call gives the plain call's outputs and
// gradients bit for bit (CPU, fp32), with the input not requiring grad, several inputs and outputs, non-tensor
// arguments and tensors read from elsewhere; dropout and bf16 autocast recompute as they ran; the wrapper keeps the
// model's names; misuse is an error that says what to do; and the forward keeps a fraction of the memory.
#include <accel/checkpoint/safetensors.hpp>
#include <accel/model/activation_checkpoint.hpp>
#include <accel/model/autocast.hpp>

#include <catch2/catch.hpp>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <malloc.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

// A pre-norm residual MLP block (a transformer layer's feed-forward half), with dropout.
struct CkptBlockImpl : torch::nn::Module {
  explicit CkptBlockImpl(std::int64_t d, double p = 0.0)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))),
        drop(register_module("drop", torch::nn::Dropout(p))) {}
  at::Tensor forward(const at::Tensor& x) { return x + drop(fc2(torch::gelu(fc1(norm(x))))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(CkptBlock);

// The parameters' gradients (cloned), then cleared.
std::vector<at::Tensor> take_grads(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    p.mutable_grad() = at::Tensor();
  }
  return out;
}
bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].defined() != b[k].defined() || (a[k].defined() && !at::equal(a[k], b[k]))) return false;
  return true;
}
std::vector<std::string> names(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  for (const auto& b : m.named_buffers()) out.push_back(b.key());
  return out;
}
at::Tensor rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

// LibTorch's CPU allocation, counted (as benchmarks/tensor_counter.hpp counts): the bytes of the blocks alive now,
// and the most alive at once since `reset`.
class Counted final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    void* p = c10::alloc_cpu(n);
    if (p) add(std::int64_t(malloc_usable_size(p)));
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  static std::int64_t live() { return live_.load(); }
  static std::int64_t peak() { return peak_.load(); }
  static void reset() { peak_.store(live_.load()); }

 private:
  static void add(std::int64_t n) {
    const std::int64_t now = live_.fetch_add(n) + n;
    std::int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  static void release(void* p) {
    if (!p) return;
    live_.fetch_sub(std::int64_t(malloc_usable_size(p)));
    c10::free_cpu(p);
  }
  static inline std::atomic<std::int64_t> live_{0}, peak_{0};
};

}  // namespace

TEST_CASE("activation_checkpoint: outputs and gradients equal the plain call's, bit for bit",
          "[activation_checkpoint]") {
  torch::manual_seed(0);
  CkptBlock block(16);
  const at::Tensor x0 = torch::randn({8, 16});
  // Plain.
  at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = block(x);
  (y * y).sum().backward();
  const auto plain = take_grads(*block);
  const at::Tensor plain_x = x.grad().clone();
  // Checkpointed.
  at::Tensor x2 = x0.clone().requires_grad_(true);
  const at::Tensor y2 = accel::activation_checkpoint([block](const at::Tensor& t) mutable { return block(t); }, x2);
  CHECK(at::equal(y, y2));
  REQUIRE(y2.grad_fn());
  CHECK(y2.grad_fn()->name().find("CheckpointFunction") != std::string::npos);
  // One node whose inputs are the argument and the six parameters the block reads: nothing inside is recorded.
  CHECK(y2.grad_fn()->next_edges().size() == 7);
  (y2 * y2).sum().backward();
  CHECK(same(take_grads(*block), plain));
  CHECK(at::equal(x2.grad(), plain_x));
  // Under no grad it is the plain call: nothing recorded.
  {
    torch::NoGradGuard no_grad;
    const at::Tensor e = accel::activation_checkpoint([block](const at::Tensor& t) mutable { return block(t); }, x2);
    CHECK_FALSE(e.requires_grad());
    CHECK(at::equal(e, y));
  }
}

TEST_CASE("activation_checkpoint: an input that does not require grad (data) still gives the parameters theirs",
          "[activation_checkpoint]") {
  torch::manual_seed(1);
  CkptBlock block(8);
  const at::Tensor x = torch::randn({4, 8});  // data: no grad
  block(x).pow(2).sum().backward();
  const auto plain = take_grads(*block);
  const at::Tensor y = accel::activation_checkpoint([block](const at::Tensor& t) mutable { return block(t); }, x);
  CHECK(y.requires_grad());  // as the plain call's: the parameters require grad
  y.pow(2).sum().backward();
  CHECK(same(take_grads(*block), plain));
  CHECK_FALSE(x.grad().defined());
  // Nothing requires grad (a frozen block, data): the output does not either, as the plain call's.
  for (auto& p : block->parameters()) p.set_requires_grad(false);
  const at::Tensor frozen = accel::activation_checkpoint([block](const at::Tensor& t) mutable { return block(t); }, x);
  CHECK_FALSE(frozen.requires_grad());
  CHECK(at::equal(frozen, block(x)));
}

TEST_CASE("activation_checkpoint: dropout draws the same mask in the recomputation, and the generator moves as once",
          "[activation_checkpoint]") {
  torch::manual_seed(2);
  CkptBlock block(16, 0.5);
  const at::Tensor x = torch::randn({8, 16});
  torch::manual_seed(7);
  const at::Tensor y = block(x);
  const at::Tensor after_plain = rng_state();
  y.sum().backward();
  const auto plain = take_grads(*block);

  torch::manual_seed(7);
  const at::Tensor y2 = accel::activation_checkpoint([block](const at::Tensor& t) mutable { return block(t); }, x);
  const at::Tensor after_forward = rng_state();
  CHECK(at::equal(after_forward, after_plain));  // the forward drew what the plain call draws
  y2.sum().backward();
  CHECK(at::equal(y, y2));
  CHECK(same(take_grads(*block), plain));        // the same mask in the recomputation
  CHECK(at::equal(rng_state(), after_forward));  // the recomputation leaves the generator where it was

  // Without preserve_rng_state the recomputation draws another mask: other gradients.
  torch::manual_seed(7);
  const at::Tensor y3 = accel::activation_checkpoint(
      {.preserve_rng_state = false}, [block](const at::Tensor& t) mutable { return block(t); }, x);
  y3.sum().backward();
  CHECK_FALSE(same(take_grads(*block), plain));
}

TEST_CASE("activation_checkpoint: a call under bf16 autocast is recomputed under it",
          "[activation_checkpoint][autocast]") {
  torch::manual_seed(3);
  CkptBlock block(16);
  // The block's MLP without its residual: a bf16 result under autocast.
  auto mlp = [block](const at::Tensor& t) mutable { return block->fc2(torch::gelu(block->fc1(block->norm(t)))); };
  const at::Tensor x = torch::randn({8, 16});
  at::Tensor y, y2;
  {
    accel::AutocastScope cast(at::kCPU, at::kBFloat16, true);
    y = mlp(x);
  }
  CHECK(y.scalar_type() == at::kBFloat16);
  y.to(at::kFloat).pow(2).sum().backward();
  const auto plain = take_grads(*block);
  {
    accel::AutocastScope cast(at::kCPU, at::kBFloat16, true);
    y2 = accel::activation_checkpoint(mlp, x);
  }
  y2.to(at::kFloat).pow(2).sum().backward();  // outside autocast, as a training loop does: recomputed under it
  CHECK(y2.scalar_type() == at::kBFloat16);
  CHECK(at::equal(y, y2));
  CHECK(same(take_grads(*block), plain));
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));  // left as it was
  CHECK(mlp(x).scalar_type() == at::kFloat);
}

TEST_CASE("activation_checkpoint: several inputs and outputs, non-tensor arguments, tensors read from elsewhere",
          "[activation_checkpoint]") {
  torch::manual_seed(4);
  const at::Tensor w = torch::randn({6, 6}, at::requires_grad());
  const at::Tensor wt = w.t();  // not a leaf: read by the call from outside it
  auto fn = [wt](const at::Tensor& a, const at::Tensor& b, double scale, std::int64_t k) {
    const at::Tensor h = torch::tanh(torch::mm(a, wt) * scale);
    return std::make_tuple(h + b, (h * b).pow(k));
  };
  const at::Tensor a0 = torch::randn({3, 6}), b = torch::randn({3, 6});  // b does not require grad
  at::Tensor a = a0.clone().requires_grad_(true);
  auto [p, q] = fn(a, b, 0.5, 3);
  (p.sum() + q.sum()).backward();
  const at::Tensor ga = a.grad().clone(), gw = w.grad().clone();
  w.mutable_grad() = at::Tensor();

  at::Tensor a2 = a0.clone().requires_grad_(true);
  auto [p2, q2] = accel::activation_checkpoint(fn, a2, b, 0.5, std::int64_t(3));
  CHECK(at::equal(p, p2));
  CHECK(at::equal(q, q2));
  (p2.sum() + q2.sum()).backward();
  CHECK(at::equal(a2.grad(), ga));
  CHECK(at::equal(w.grad(), gw));
  CHECK_FALSE(b.grad().defined());

  // An undefined tensor argument (an optional bias) is given to the call as it is.
  {
    auto affine = [](const at::Tensor& t, const at::Tensor& m, const at::Tensor& bias) {
      return bias.defined() ? torch::mm(t, m) + bias : torch::mm(t, m);
    };
    at::Tensor a6 = a0.clone().requires_grad_(true);
    const at::Tensor r = accel::activation_checkpoint(affine, a6, w, at::Tensor());
    r.sum().backward();
    CHECK(at::equal(r, torch::mm(a0, w)));
    CHECK(at::equal(a6.grad(), torch::ones({3, 6}).mm(w.t())));
    w.mutable_grad() = at::Tensor();
  }
  // Only one output used: the other's gradient is not needed.
  w.mutable_grad() = at::Tensor();
  at::Tensor a3 = a0.clone().requires_grad_(true);
  auto [p3, q3] = accel::activation_checkpoint(fn, a3, b, 0.5, std::int64_t(3));
  p3.sum().backward();
  at::Tensor a4 = a0.clone().requires_grad_(true);
  std::get<0>(fn(a4, b, 0.5, 3)).sum().backward();
  CHECK(at::equal(a3.grad(), a4.grad()));

  // A std::vector result, and torch::autograd::grad through a checkpoint (nothing accumulated).
  auto vec = [wt](const at::Tensor& t) { return std::vector<at::Tensor>{torch::mm(t, wt), t.sin()}; };
  at::Tensor a5 = a0.clone().requires_grad_(true);
  const auto v = accel::activation_checkpoint(vec, a5);
  REQUIRE(v.size() == 2);
  const auto g = torch::autograd::grad({v[0].sum() + v[1].sum()}, {a5, w});
  const auto plain_v = vec(a5);
  const auto g_plain = torch::autograd::grad({plain_v[0].sum() + plain_v[1].sum()}, {a5, w});
  CHECK(at::equal(g[0], g_plain[0]));
  CHECK(at::equal(g[1], g_plain[1]));
  CHECK_FALSE(a5.grad().defined());
}

TEST_CASE("Checkpointed: a Sequential keeps the plain model's names and trains as it does", "[activation_checkpoint]") {
  auto build = [](bool wrapped) {
    torch::manual_seed(5);
    CkptBlock b1(8, 0.25), b2(8, 0.25);
    torch::nn::BatchNorm1d bn(8);
    torch::nn::Linear head(8, 3);
    // BatchNorm stays outside: a recomputation would update its running statistics twice (as with torch's
    // checkpoint).
    if (!wrapped) return torch::nn::Sequential(b1, bn, b2, head);
    return torch::nn::Sequential(accel::Checkpointed(b1), bn, accel::checkpointed(b2), head);
  };
  auto plain = build(false), ckpt = build(true);
  CHECK(names(*ckpt) == names(*plain));
  CHECK(names(*ckpt)[0] == "0.norm.weight");
  CHECK(names(*accel::Checkpointed(torch::nn::BatchNorm1d(8))) == names(*torch::nn::BatchNorm1d(8)));  // buffers
  // torch::save of one loads into the other; so does a safetensors file (save_model, Accelerate's names), strictly.
  {
    std::stringstream file;
    torch::save(ckpt, file);
    auto other = build(false);
    for (auto& p : other->parameters()) p.detach().zero_();
    torch::load(other, file);
    for (std::size_t k = 0; k < other->parameters().size(); ++k)
      CHECK(at::equal(other->parameters()[k], plain->parameters()[k]));
    const auto dir = std::filesystem::temp_directory_path() / ("accel_actckpt_" + std::to_string(::getpid()));
    accel::checkpoint::save_model(*ckpt, dir);
    auto third = build(false);
    for (auto& p : third->parameters()) p.detach().zero_();
    accel::checkpoint::load_model(*third, dir);
    for (std::size_t k = 0; k < third->parameters().size(); ++k)
      CHECK(at::equal(third->parameters()[k], plain->parameters()[k]));
    std::filesystem::remove_all(dir);
  }
  torch::optim::SGD o1(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD o2(ckpt->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < 3; ++s) {
    const at::Tensor x = torch::randn({16, 8}), t = torch::randn({16, 3});
    torch::manual_seed(100 + s);
    torch::mse_loss(plain->forward(x), t).backward();
    torch::manual_seed(100 + s);
    torch::mse_loss(ckpt->forward(x), t).backward();
    o1.step(), o2.step();
    o1.zero_grad(), o2.zero_grad();
  }
  for (std::size_t k = 0; k < plain->parameters().size(); ++k)
    CHECK(at::equal(plain->parameters()[k], ckpt->parameters()[k]));
  for (std::size_t k = 0; k < plain->buffers().size(); ++k) CHECK(at::equal(plain->buffers()[k], ckpt->buffers()[k]));
  // eval() reaches the wrapped modules (dropout off, BatchNorm's running statistics).
  ckpt->eval();
  plain->eval();
  const at::Tensor x = torch::randn({4, 8});
  CHECK(at::equal(ckpt->forward(x), plain->forward(x)));
  CHECK_FALSE(ckpt[0]->as<accel::CheckpointedImpl<CkptBlockImpl>>()->module()->is_training());
  // Full sharding's unit_types<CkptBlock> takes a checkpointed block for a block.
  CHECK(accel::plan_units(*ckpt, {.unit_if = accel::unit_types<CkptBlock>()}) == std::vector<std::string>{"0", "2"});
  // A ModuleList element: the names of the plain list ("1.fc1.weight"), called through its Impl type.
  {
    torch::manual_seed(9);
    CkptBlock l0(8), l1(8);
    torch::nn::ModuleList plain_list(l0, l1), ckpt_list(accel::checkpointed(l0), accel::checkpointed(l1));
    CHECK(names(*ckpt_list) == names(*plain_list));
    const at::Tensor xl = torch::randn({4, 8});
    at::Tensor h = xl;
    for (const auto& m : *ckpt_list) h = m->as<accel::CheckpointedImpl<CkptBlockImpl>>()->forward(h);
    h.sum().backward();
    const auto g1 = take_grads(*plain_list);
    CHECK(at::equal(h, l1(l0(xl))));
    l1(l0(xl)).sum().backward();
    CHECK(same(g1, take_grads(*plain_list)));
  }
  // A Sequential checkpointed whole (tensor to tensor); pretty printing names the wrapper.
  torch::manual_seed(6);
  torch::nn::Sequential seg(torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8));
  accel::Checkpointed whole(seg);
  CHECK(names(*whole) == names(*seg));
  const at::Tensor xs = torch::randn({2, 8});
  whole->forward(xs).sum().backward();
  const auto g1 = take_grads(*seg);
  seg->forward(xs).sum().backward();
  CHECK(same(g1, take_grads(*seg)));
  std::ostringstream printed;
  printed << *whole;
  CHECK(printed.str().find("accel::Checkpointed(") == 0);
}

TEST_CASE("activation_checkpoint: nested checkpoints give the plain call's gradients", "[activation_checkpoint]") {
  torch::manual_seed(10);
  CkptBlock inner(8), outer(8);
  const at::Tensor x = torch::randn({4, 8});
  outer(inner(x)).pow(2).sum().backward();
  const auto g_inner = take_grads(*inner), g_outer = take_grads(*outer);
  // The outer call checkpoints the inner one: plain in the forward (under no grad), a checkpoint in the
  // recomputation, itself recomputed inside the outer backward.
  auto both = [inner, outer](const at::Tensor& t) mutable {
    return outer(accel::activation_checkpoint([inner](const at::Tensor& u) mutable { return inner(u); }, t));
  };
  accel::activation_checkpoint(both, x).pow(2).sum().backward();
  CHECK(same(take_grads(*inner), g_inner));
  CHECK(same(take_grads(*outer), g_outer));
}

TEST_CASE("activation_checkpoint: misuse is an error that names the problem and the fix", "[activation_checkpoint]") {
  const at::Tensor x = torch::randn({3, 4}, at::requires_grad());
  CHECK_THROWS_AS(accel::activation_checkpoint([](const at::Tensor&) { return std::vector<at::Tensor>{}; }, x),
                  accel::InvalidArgument);
  CHECK_THROWS_WITH(accel::activation_checkpoint([](const at::Tensor&) { return std::vector<at::Tensor>{}; }, x),
                    Catch::Contains("fn returned no tensor"));
  CHECK_THROWS_WITH(
      accel::activation_checkpoint([](const at::Tensor& t) { return std::make_tuple(t * 2, at::Tensor()); }, x),
      Catch::Contains("result 1 is an undefined tensor"));
  // A second backward without retain_graph: named, with the fix (SumBackward saves no tensor, so the checkpoint's
  // node is the first to find its inputs freed).
  {
    const at::Tensor y = accel::activation_checkpoint([](const at::Tensor& t) { return t.exp(); }, x);
    const at::Tensor loss = y.sum();
    loss.backward();
    CHECK_THROWS_AS(loss.backward(), accel::InvalidArgument);
    try {
      loss.backward();
    } catch (const std::exception& e) {
      CHECK_THAT(e.what(), Catch::Contains("second backward through a checkpointed call") &&
                               Catch::Contains("retain_graph = true"));
    }
    x.mutable_grad() = at::Tensor();
    const at::Tensor z = accel::activation_checkpoint([](const at::Tensor& t) { return t.exp(); }, x).sum();
    z.backward({}, /*retain_graph=*/true);
    z.backward();  // retained: the call is recomputed again
    CHECK(torch::allclose(x.grad(), 2 * x.exp()));
  }
  // A call that computes something else when called again.
  {
    int calls = 0;
    const at::Tensor y = accel::activation_checkpoint(
        [&calls](const at::Tensor& t) { return ++calls == 1 ? t * 2 : t.narrow(0, 0, 1) * 2; }, x);
    CHECK_THROWS_WITH(y.sum().backward(), Catch::Contains("the recomputation in the backward returned 1 tensor(s): "
                                                          "Float[1, 4] where the forward returned 1 tensor(s): "
                                                          "Float[3, 4]") &&
                                              Catch::Contains("must compute the same thing"));
  }
}

TEST_CASE("activation_checkpoint: a deep model's forward keeps a fraction of the memory for backward",
          "[activation_checkpoint][memory]") {
  // 16 blocks of width 64 (hidden 256), a batch of 1024: the bytes alive after the forward (what autograd keeps for
  // the backward, and the output), and the most alive at once during forward and backward, counted at LibTorch's CPU
  // allocator; the same model and batch without and with each block checkpointed.
  torch::manual_seed(8);
  std::vector<CkptBlock> blocks;
  for (int k = 0; k < 16; ++k) blocks.emplace_back(64);
  const at::Tensor x = torch::randn({1024, 64});
  c10::Allocator* previous = c10::GetCPUAllocator();
  static Counted counted;
  c10::SetCPUAllocator(&counted, std::numeric_limits<std::uint8_t>::max());
  struct Restore {
    c10::Allocator* a;
    ~Restore() { c10::SetCPUAllocator(a, std::numeric_limits<std::uint8_t>::max()); }
  } restore{previous};
  auto run = [&](bool ckpt) {
    for (auto& b : blocks) (void)take_grads(*b);  // no gradient held from a previous run
    const std::int64_t before = Counted::live();
    Counted::reset();
    at::Tensor h = x;
    for (auto& b : blocks)
      h = ckpt ? accel::activation_checkpoint([b](const at::Tensor& t) mutable { return b(t); }, h) : b(h);
    const at::Tensor loss = h.pow(2).mean();
    const std::int64_t kept = Counted::live() - before;
    loss.backward();
    const std::int64_t peak = Counted::peak() - before;
    std::vector<at::Tensor> grads;
    for (auto& b : blocks)
      for (auto& g : take_grads(*b)) grads.push_back(g);
    return std::make_tuple(kept, peak, grads);
  };
  const auto [kept_plain, peak_plain, grads_plain] = run(false);
  const auto [kept_ckpt, peak_ckpt, grads_ckpt] = run(true);
  CHECK(same(grads_plain, grads_ckpt));
  // Each block keeps its input (256 KiB) instead of its activations (about 2.5 MiB).
  CHECK(kept_ckpt * 8 < kept_plain);
  CHECK(peak_ckpt * 3 < peak_plain);
  INFO("kept after forward: " << kept_plain << " B plain, " << kept_ckpt << " B checkpointed; peak " << peak_plain
                              << " B plain, " << peak_ckpt << " B checkpointed");
  CHECK(kept_plain > 0);
}
