// Full sharding's units (model/unit_sharder.hpp): which submodules `plan_units` makes units (FSDP's size-based rule,
// a type predicate, names), the layouts refused, and the interception on one process: a forward and backward
// through a sharded model gather each unit on its first use and free it after, and give the gradients a plain
// model gets.
#include <accel/model/distributed_module.hpp>

#include <catch2/catch.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

using Strings = std::vector<std::string>;

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
  {
    torch::NoGradGuard g;
    auto a = net->parameters(), b = ref->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
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

TEST_CASE("UnitSharder: prefetching records the forward's and the backward's order and changes no gradient",
          "[sharding]") {
  torch::manual_seed(12);
  Tower net, ref;
  {
    torch::NoGradGuard g;
    auto a = net->parameters(), b = ref->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
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
