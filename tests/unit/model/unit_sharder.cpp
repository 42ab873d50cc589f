// Full sharding's units (model/unit_sharder.hpp): which submodules `plan_units` makes units (FSDP's size-based rule,
// a type predicate, names), the layouts refused, and the interception on one process: a forward and backward
// through a sharded model gather each unit on its first use and free it after, and give the gradients a plain
// model gets.
#include <accel/checkpoint/checkpointer.hpp>
#include <accel/model/distributed_module.hpp>

#include <catch2/catch.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

namespace {

using Strings = std::vector<std::string>;

// `to` takes `from`'s parameter values (two models of one architecture).
void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto a = from.parameters(), b = to.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::Tanh(), torch::nn::Linear(10, 10),
                               torch::nn::Tanh(), torch::nn::Linear(10, 4));
}

struct TowerImpl : torch::nn::Module {
  TowerImpl() {
    body = register_module("body", torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4)));
    heads = register_module("heads", torch::nn::ModuleList(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4)));
    out = register_module("out", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = body->forward(x);
    for (const auto& m : *heads) h = h + m->as<torch::nn::Linear>()->forward(h);  // children called directly
    return out(torch::tanh(h));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::ModuleList heads{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Tower);

}  // namespace

TEST_CASE("plan_units follows FSDP's size-based rule, type predicates and names", "[sharding]") {
  auto net = mlp();  // Linear units of 70, 110 and 44 elements
  CHECK(accel::plan_units(*net, {.min_num_params = 100}) == Strings{"2"});
  CHECK(accel::plan_units(*net, {.min_num_params = 50}) == Strings{"0", "2"});
  CHECK(accel::plan_units(*net, {.min_num_params = 1000}).empty());
  CHECK(accel::plan_units(*net, {.unit_if = accel::unit_types<torch::nn::Linear>()}) == Strings{"0", "2", "4"});
  CHECK(accel::plan_units(*net, {.units = {"4"}, .min_num_params = 100}) == Strings{"2", "4"});
  Tower tower;
  // body.0 and body.1 (20 each) stay, body (40 left) becomes a unit; a ModuleList never does, its Linears are 20.
  CHECK(accel::plan_units(*tower, {.min_num_params = 30}) == Strings{"body"});
  CHECK(accel::plan_units(*tower, {.min_num_params = 20}) ==
        Strings{"body.0", "body.1", "heads.0", "heads.1"});  // out (10) stays in the root
  CHECK_THROWS_WITH(accel::plan_units(*net, {.units = {"5"}}),
                    Catch::Contains("'5' is not a submodule of the model") && Catch::Contains("'0', '1', '2'"));
}

TEST_CASE("UnitSharder: one process gathers each unit on use and gives a plain model's gradients", "[sharding]") {
  torch::manual_seed(11);
  Tower net, ref;
  copy_parameters(*net, *ref);
  accel::DistributedModule ddp(net.ptr(), nullptr);
  ddp.shard_parameters({.units = {"body", "heads.0", "heads.1"}});
  const auto& sharder = *ddp.sharder();
  REQUIRE(sharder.units().size() == 4);
  CHECK(sharder.units()[0].params.size() == 2);  // out.weight, out.bias in the root unit
  CHECK(sharder.gathered_bytes() == 0);
  const at::Tensor x = torch::randn({5, 4}), y = torch::randn({5, 2});
  for (int step = 0; step < 2; ++step) {
    ddp.before_forward();
    const at::Tensor loss = torch::mse_loss(net->forward(x), y);
    ddp.after_forward(true);
    CHECK(sharder.gathered_bytes() == 10 * 4);  // the root's 10 elements kept for backward, the units freed
    loss.backward();
    CHECK(sharder.gathered_bytes() == 0);
    torch::mse_loss(ref->forward(x), y).backward();
  }
  // Each unit's gradient shard (the whole unit on one process) holds the sum of both steps' gradients.
  for (const auto& item : ref->named_parameters()) {
    const auto* piece = sharder.piece_of(net->named_parameters()[item.key()]);
    REQUIRE(piece);
    CHECK(piece->numel == item.value().numel());
    CHECK(torch::allclose(piece->grad, item.value().grad().flatten(), 1e-6, 1e-7));
  }
  CHECK(sharder.peak_gathered_bytes() < 4 * (40 + 20 + 20 + 10) * 4);  // never the whole model twice
}

TEST_CASE("A fully sharded model's checkpoint holds its shards and buffers, and refuses another unit layout",
          "[sharding]") {
  namespace fs = std::filesystem;
  auto make = [](std::uint64_t seed) {
    torch::manual_seed(seed);
    return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 3));
  };
  auto sharded = [](torch::nn::Sequential& net, Strings units) {
    auto d = std::make_shared<accel::DistributedModule>(net.ptr(), nullptr);
    d->shard_parameters({.units = std::move(units)});
    return d;
  };
  const auto dir = fs::temp_directory_path() / ("accel_sharded_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const accel::checkpoint::Checkpointer::Process p{0, 1, c10::Device(c10::kCPU), [] {}};
  auto net = make(1);
  auto ddp = sharded(net, {"0", "2"});
  ddp->before_forward();
  const at::Tensor loss = net->forward(torch::randn({8, 6})).pow(2).sum();  // moves the running statistics
  ddp->after_forward(true);
  loss.backward();
  accel::checkpoint::Checkpointer ck;
  ck.add_model(net.ptr(), accel::checkpoint::sharded_model(ddp->sharder()));
  ck.save(dir, p, 0, false);
  CHECK(fs::exists(dir / "model_0_rank0.pt"));
  CHECK_FALSE(fs::exists(dir / "model.pt"));
  // Into another model of the same units: its parameters and buffers become the saved ones.
  auto other = make(2);
  auto ddp2 = sharded(other, {"0", "2"});
  accel::checkpoint::Checkpointer ck2;
  ck2.add_model(other.ptr(), accel::checkpoint::sharded_model(ddp2->sharder()));
  ck2.load(dir, p);
  {
    accel::GatheredParameters a({ddp->sharder()}, false), b({ddp2->sharder()}, false);
    for (const auto& item : net->named_parameters())
      CHECK(at::equal(item.value(), other->named_parameters()[item.key()]));
    for (const auto& item : net->named_buffers()) CHECK(at::equal(item.value(), other->named_buffers()[item.key()]));
  }
  CHECK(ddp2->sharder()->gathered_bytes() == 0);
  // Into the same model cut into other units: refused naming the file and the fix, nothing restored.
  auto third = make(3);
  auto ddp3 = sharded(third, {"0"});
  accel::checkpoint::Checkpointer ck3;
  ck3.add_model(third.ptr(), accel::checkpoint::sharded_model(ddp3->sharder()));
  const at::Tensor before = third->named_buffers()["1.running_mean"].clone();
  CHECK_THROWS_WITH(ck3.load(dir, p), Catch::Contains("model_0_rank0.pt") && Catch::Contains("mismatched units") &&
                                          Catch::Contains("has '2.weight' where the checkpoint's has 'unit 0'") &&
                                          Catch::Contains("Options::sharding"));
  CHECK(at::equal(before, third->named_buffers()["1.running_mean"]));
  fs::remove_all(dir);
}

TEST_CASE("MixedPrecisionPolicy: bf16 parameters compute, fp32 shards keep the model and take the gradients",
          "[sharding]") {
  torch::manual_seed(12);
  auto net = mlp();
  auto ref = mlp();
  std::vector<at::Tensor> exact;
  {
    torch::NoGradGuard g;
    auto a = net->parameters(), b = ref->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]), exact.push_back(a[i].clone());
  }
  ref->to(at::kBFloat16);  // what the policy computes with
  accel::DistributedModule ddp(net.ptr(), nullptr);
  ddp.shard_parameters({.units = {"0", "2"}, .mp_policy = {.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat}});
  const auto& sharder = *ddp.sharder();
  CHECK(sharder.input_dtype() == at::kBFloat16);
  CHECK(net->parameters()[0].scalar_type() == at::kBFloat16);  // the parameters compute in bf16 ...
  const auto* first = sharder.piece_of(net->parameters()[0]);
  REQUIRE(first);
  CHECK(first->shard.scalar_type() == at::kFloat);  // ... the shards keep fp32
  // Gathered whole (a checkpoint, gather_parameters), the parameters read as the fp32 model, not a bf16 rounding.
  {
    accel::GatheredParameters whole({ddp.sharder()}, false);
    auto p = net->parameters();
    for (std::size_t i = 0; i < p.size(); ++i) {
      CHECK(p[i].scalar_type() == at::kFloat);
      CHECK(at::equal(p[i], exact[i]));
    }
  }
  CHECK(net->parameters()[0].scalar_type() == at::kBFloat16);
  CHECK(sharder.gathered_bytes() == 0);
  const at::Tensor x = torch::randn({5, 6}).to(at::kBFloat16), y = torch::randn({5, 4});
  ddp.before_forward();
  const at::Tensor out = net->forward(x);
  ddp.after_forward(true);
  CHECK(out.scalar_type() == at::kBFloat16);
  torch::mse_loss(out.to(at::kFloat), y).backward();
  const at::Tensor want = ref->forward(x);
  CHECK(at::equal(out, want));
  torch::mse_loss(want.to(at::kFloat), y).backward();
  // The bf16 gradients, cast to fp32 before the (one-process) reduction, land in the fp32 gradient shards.
  for (const auto& item : ref->named_parameters()) {
    const auto* piece = sharder.piece_of(net->named_parameters()[item.key()]);
    REQUIRE(piece);
    CHECK(piece->grad.scalar_type() == at::kFloat);
    CHECK(at::equal(piece->grad, item.value().grad().to(at::kFloat).flatten()));
  }
}

namespace {
// A module whose children live in a ModuleDict and are called through it.
struct RouterImpl : torch::nn::Module {
  RouterImpl() {
    experts =
        register_module("experts", torch::nn::ModuleDict(torch::OrderedDict<std::string, std::shared_ptr<Module>>{
                                       {"a", torch::nn::Linear(4, 4).ptr()}, {"b", torch::nn::Linear(4, 4).ptr()}}));
    out = register_module("out", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = experts["a"]->as<torch::nn::Linear>()->forward(x) +
                         torch::relu(experts["b"]->as<torch::nn::Linear>()->forward(x));
    return out(h);
  }
  torch::nn::ModuleDict experts{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Router);
}  // namespace

TEST_CASE("UnitSharder: a ModuleDict's members as units give a plain model's gradients", "[sharding]") {
  torch::manual_seed(13);
  Router net, ref;
  copy_parameters(*net, *ref);
  accel::DistributedModule ddp(net.ptr(), nullptr);
  // min_num_params never makes the ModuleDict itself a unit; its members (20 elements each) are.
  ddp.shard_parameters({.min_num_params = 20});
  const auto& sharder = *ddp.sharder();
  REQUIRE(sharder.units().size() == 3);
  CHECK(sharder.units()[1].name == "experts.a");
  CHECK(sharder.units()[2].name == "experts.b");
  const at::Tensor x = torch::randn({5, 4}), y = torch::randn({5, 2});
  ddp.before_forward();
  const at::Tensor loss = torch::mse_loss(net->forward(x), y);
  ddp.after_forward(true);
  loss.backward();
  CHECK(sharder.gathered_bytes() == 0);
  torch::mse_loss(ref->forward(x), y).backward();
  for (const auto& item : ref->named_parameters()) {
    const auto* piece = sharder.piece_of(net->named_parameters()[item.key()]);
    REQUIRE(piece);
    CHECK(at::equal(piece->grad, item.value().grad().flatten()));
  }
}

TEST_CASE("UnitSharder: prefetching records the forward's and the backward's order and changes no gradient",
          "[sharding]") {
  torch::manual_seed(12);
  Tower net, ref;
  copy_parameters(*net, *ref);
  accel::DistributedModule on(net.ptr(), nullptr), off(ref.ptr(), nullptr);
  on.shard_parameters({.units = {"body", "heads.0", "heads.1"}});
  off.shard_parameters(
      {.units = {"body", "heads.0", "heads.1"}, .forward_prefetch = false, .backward_prefetch = false});
  const auto& sharder = *on.sharder();
  using Order = std::vector<std::size_t>;
  const at::Tensor x = torch::randn({5, 4}), y = torch::randn({5, 2});
  for (int step = 0; step < 3; ++step) {
    const auto started = sharder.prefetches(), used = sharder.prefetches_used();
    for (auto* d : {&on, &off}) {
      d->before_forward();
      auto& m = d == &on ? net : ref;
      const at::Tensor loss = torch::mse_loss(m->forward(x), y);
      d->after_forward(true);
      loss.backward();
    }
    // The root (out) comes last in the forward; in the backward it is gathered already (kept since the forward).
    CHECK(sharder.forward_order() == Order{1, 2, 3, 0});
    CHECK(sharder.backward_order() == Order{3, 2, 1});
    // The first forward records only; its backward prefetches heads.0 and body by the forward's order reversed;
    // later steps also prefetch heads.0, heads.1 and the root in their forward. Each is used.
    CHECK(sharder.prefetches() - started == (step == 0 ? 2 : 5));
    CHECK(sharder.prefetches_used() - used == sharder.prefetches() - started);
    CHECK(sharder.gathered_bytes() == 0);
    CHECK(off.sharder()->prefetches() == 0);
  }
  // The same gradient shards, bit for bit.
  for (std::size_t u = 0; u < sharder.units().size(); ++u)
    CHECK(torch::equal(sharder.units()[u].grad, off.sharder()->units()[u].grad));
  CHECK(sharder.peak_gathered_bytes() <= (40 + 20 + 10) * 4);  // the root and two units at most
}
