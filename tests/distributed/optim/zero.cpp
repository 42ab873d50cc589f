// ZeRO stages 1 and 2 (accel::shard::optimizer / accel::shard::gradients, optim/sharded.hpp and
// model/partition_reducer.hpp) on N real processes: training equals DDP training (same data, same start) within
// 1e-6 for SGD with momentum, Adam, AdamW, RMSprop and Adagrad, with gradient accumulation, two parameter groups and
// clip_grad_norm_ (clip_grad_value_ too under stage 2); each rank holds 1/N of the state (and under stage 2 of the
// gradients: the parameters hold none after a synchronising backward); a checkpoint of the partitions resumes
// bit-identically, and one stage resumes the other's; bad input is refused with a clear error.
#include "../harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace mp {

namespace {
struct Ddp : accel::Accelerator<accel::dist::from_env> {};
struct Zero1 : accel::Accelerator<accel::dist::from_env, accel::shard::optimizer> {};
struct Zero2 : accel::Accelerator<accel::dist::from_env, accel::shard::gradients> {};

accel::Options zero_options() {
  return accel::Options{.gradient_accumulation_steps = 2, .bucket_bytes = 128, .comm = options(30000).comm};
}
torch::nn::Sequential make_net() {
  at::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(5, 7), torch::nn::Tanh(), torch::nn::Linear(7, 3));
}
// Two groups: the weights (with the options given) and the biases (a tenth of the learning rate).
template <class O, class Options>
std::shared_ptr<O> make_opt(torch::nn::Sequential& net, Options o) {
  std::vector<at::Tensor> weights, biases;
  for (const auto& p : net->named_parameters())
    (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
  auto bias_options = std::make_unique<Options>(o);
  bias_options->lr(o.lr() / 10);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights);
  groups.emplace_back(biases, std::move(bias_options));
  return std::make_shared<O>(std::move(groups), o);
}
at::Tensor batch_x(int step, int rank) {
  at::manual_seed(1000 + 10 * step + rank);
  return at::randn({4, 5});
}
at::Tensor batch_y(int step, int rank) {
  at::manual_seed(5000 + 10 * step + rank);
  return at::randn({4, 3});
}

// `steps` micro-batches from `first`, clipping on synchronising steps (by norm, and by value where `by_value`).
// `released`, when given, counts the synchronising steps after which some parameter still held a gradient.
template <class Acc, class Model, class Opt>
void train(Acc& acc, Model& model, Opt& opt, int first, int steps, bool by_value = false, int* released = nullptr) {
  for (int s = first; s < first + steps; ++s) {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(batch_x(s, acc.process_index())), batch_y(s, acc.process_index())));
    if (released && acc.sync_gradients())
      for (const auto& p : model->parameters()) *released += p.grad().defined() ? 1 : 0;
    if (acc.sync_gradients()) acc.clip_grad_norm_(model, 0.05);
    if (by_value && acc.sync_gradients()) acc.clip_grad_value_(model, 0.004);
    opt.step();
    opt.zero_grad();
  }
}
double max_diff(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double worst = 0;
  auto x = a->parameters(), y = b->parameters();
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, (x[i] - y[i]).abs().max().item<double>());
  return worst;
}
template <class Zero, class O, class Options>
void exact(std::string name, Options o, const std::string& scratch) {
  constexpr int stage = Zero::config::zero_stage;
  name += "_stage" + std::to_string(stage);
  const int steps = 8;
  const bool by_value = stage == 2;
  auto ddp_net = make_net();
  Ddp ddp{zero_options()};
  auto [dm, dopt] = ddp.prepare(ddp_net, make_opt<O>(ddp_net, o));
  train(ddp, dm, dopt, 0, steps, by_value);

  auto zero_net = make_net();
  Zero zero{zero_options()};
  auto [zm, zopt] = zero.prepare(zero_net, make_opt<O>(zero_net, o));
  check(zopt.sharded() != nullptr && zopt.sharded()->stage() == stage, name + ": the optimizer is sharded");
  int held = 0;
  train(zero, zm, zopt, 0, steps, by_value, &held);
  const double diff = max_diff(ddp_net, zero_net);
  check(diff < 1e-6, name + ": ZeRO stage " + std::to_string(stage) + " equals DDP within 1e-6 (max diff " +
                         std::to_string(diff) + ")");
  if (stage == 2) {
    check(held == 0, name + ": after every synchronising backward the parameters hold no gradient (" +
                         std::to_string(held) + " did)");
    check(zm.distributed().shards_gradients() && zm.distributed().gradient_bytes() == zopt.sharded()->total_numel() * 4,
          name + ": every gradient element is sent once, to its owner");
  }

  // 1/N of the state: this rank's bytes, and all ranks' together are the whole optimizer's.
  const auto& sh = *zopt.sharded();
  const std::int64_t mine = sh.state_bytes(), whole = accel::optimizer_state_bytes(dopt.inner());
  const at::Tensor sum = accel::reduce(zero.comm(), at::full({1}, double(mine), at::kDouble), accel::Reduction::sum);
  check(sum.item<double>() == double(whole) && whole > 0,
        name + ": the partitions' state adds up to the whole optimizer's");
  check(mine <= whole / sh.total_numel() * sh.partition_numel(),
        name + ": this rank holds at most its partition's state");
  check(accel::optimizer_state_bytes(zopt.inner()) == 0, name + ": the user's optimizer holds no state");

  // Consolidated on the last rank: the user's optimizer there holds DDP's state (every parameter, every tensor,
  // the step count); it saves and loads as an unsharded optimizer; elsewhere nothing; released after.
  const int to = zero.num_processes() - 1;
  zopt.sharded()->consolidate(to);
  if (zero.process_index() == to) {
    auto state_diff = [](torch::optim::Optimizer& a, torch::optim::Optimizer& b, const std::vector<at::Tensor>& pa,
                         const std::vector<at::Tensor>& pb) {
      using S = typename accel::ShardTraits<O>::State;
      double worst = 0;
      for (std::size_t i = 0; i < pa.size(); ++i) {
        auto ia = a.state().find(pa[i].unsafeGetTensorImpl());
        auto ib = b.state().find(pb[i].unsafeGetTensorImpl());
        if (ia == a.state().end() || ib == b.state().end()) return 1e9;
        auto& sa = static_cast<S&>(*ia->second);
        auto& sb = static_cast<S&>(*ib->second);
        if (accel::detail::state_step(sa) != accel::detail::state_step(sb)) return 1e9;
        std::vector<at::Tensor> ta, tb;
        accel::detail::state_tensors(sa, [&](const at::Tensor& t, auto&&) { ta.push_back(t); });
        accel::detail::state_tensors(sb, [&](const at::Tensor& t, auto&&) { tb.push_back(t); });
        for (std::size_t k = 0; k < ta.size(); ++k) {
          if (ta[k].defined() != tb[k].defined()) return 1e9;
          // allclose's rule (atol 1e-6 below, rtol 1e-4): centered RMSprop's momentum (about 10 here) divides by the
          // root of a small variance, so the reductions' float rounding reaches it relative to its size (1.6e-5 seen).
          if (ta[k].defined())
            worst = std::max(worst, ((ta[k] - tb[k]).abs() - 1e-4 * tb[k].abs()).max().item<double>());
        }
      }
      return worst;
    };
    const double sd = state_diff(zopt.inner(), dopt.inner(), zero_net->parameters(), ddp_net->parameters());
    check(sd < 1e-6, name + ": the consolidated state equals DDP's optimizer state (max diff beyond 1e-4 relative " +
                         std::to_string(sd) + ")");
    const auto file = std::filesystem::path(scratch) / ("consolidated_" + name + ".pt");
    torch::save(zopt.inner(), file.string());
    auto plain_net = make_net();
    auto plain = make_opt<O>(plain_net, o);
    torch::load(*plain, file.string());
    check(state_diff(*plain, zopt.inner(), plain_net->parameters(), zero_net->parameters()) == 0,
          name + ": an unsharded optimizer loads the consolidated state as saved");
  } else {
    check(zopt.inner().state().empty(), name + ": ranks other than the target hold no consolidated state");
  }
  zopt.sharded()->release_consolidated();
  check(zopt.inner().state().empty(), name + ": release_consolidated() empties the user's optimizer");

  // Checkpoint: save, train on, reload, train the same batches again: bit-identical.
  const auto dir = std::filesystem::path(scratch) / ("zero_" + name);
  zero.save_state(dir);
  train(zero, zm, zopt, steps, 4, by_value);
  std::vector<at::Tensor> after;
  for (const auto& p : zero_net->parameters()) after.push_back(p.detach().clone());
  zero.load_state(dir);
  train(zero, zm, zopt, steps, 4, by_value);
  bool identical = true;
  auto ps = zero_net->parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) identical = identical && at::equal(ps[i], after[i]);
  check(identical, name + ": resuming from the partitions' checkpoint is bit-identical");
  // The other stage resumes the same partitions (the same state, cut the same way).
  using Other = std::conditional_t<stage == 1, Zero2, Zero1>;
  auto other_net = make_net();
  Other other{zero_options()};
  auto [om, oopt] = other.prepare(other_net, make_opt<O>(other_net, o));
  other.load_state(dir);
  train(other, om, oopt, steps, 4, by_value);
  check(max_diff(other_net, zero_net) < 1e-6, name + ": the other ZeRO stage resumes this stage's checkpoint");
  // The same checkpoint into an unsharded job: refused.
  try {
    ddp.load_state(dir);
    check(false, name + ": a sharded checkpoint into an unsharded job is refused");
  } catch (const std::exception& e) {
    check(std::string(e.what()).find("was sharded (accel::shard::optimizer") != std::string::npos,
          name + ": the message says why (" + e.what() + ")");
  }
}

// A GradScaler over ZeRO (on the CPU, where its kernels also run): stage 2 unscales and checks the partition's
// gradients (`gradient_holder`), the inf/NaN finding is summed across ranks; an overflow on one rank at one step
// makes every rank skip it, as under DDP; training and the scale then equal DDP's.
template <class Zero>
void scaled(const std::string& name) {
  auto run = [&](auto& acc, auto& net, auto& opt, torch::optim::Optimizer& holder, auto step) {
    accel::GradScaler scaler(c10::Device(c10::kCPU), acc.comm(), {.init_scale = 1024.0, .growth_interval = 2});
    int skipped = 0;
    for (int s = 0; s < 12; ++s) {
      auto scope = acc.accumulate(net);
      at::Tensor loss = torch::mse_loss(net(batch_x(s, acc.process_index())), batch_y(s, acc.process_index()));
      if (s == 5 && acc.process_index() == acc.num_processes() - 1)
        loss = loss * std::numeric_limits<float>::infinity();
      acc.backward(scaler.scale(loss));
      if (!acc.sync_gradients()) continue;
      scaler.unscale_(holder);
      acc.clip_grad_norm_(net, 0.05);
      skipped += scaler.step(holder, step) ? 0 : 1;
      scaler.update();
      opt.zero_grad();
    }
    return std::pair{skipped, scaler.get_scale()};
  };
  auto ddp_net = make_net(), zero_net = make_net();
  Ddp ddp{zero_options()};
  auto [dm, dopt] = ddp.prepare(
      ddp_net, std::make_shared<torch::optim::Adam>(ddp_net->parameters(), torch::optim::AdamOptions(0.01)));
  const auto plain = run(ddp, dm, dopt, dopt.inner(), [&] { dopt.inner().step(); });
  Zero zero{zero_options()};
  auto [zm, zopt] = zero.prepare(
      zero_net, std::make_shared<torch::optim::Adam>(zero_net->parameters(), torch::optim::AdamOptions(0.01)));
  const auto sharded = run(zero, zm, zopt, zopt.sharded()->gradient_holder(), [&] { zopt.sharded()->step(); });
  check(plain.first == 1 && sharded.first == 1, name + ": the overflow on one rank skips that step on every rank");
  check(plain.second == sharded.second, name + ": the scale follows DDP's (" + std::to_string(sharded.second) + ")");
  const double diff = max_diff(ddp_net, zero_net);
  check(diff < 1e-6, name + ": training with the scaler equals DDP's (max diff " + std::to_string(diff) + ")");
}

// Two models, each with its own optimizer (a GAN's generator and critic), the second model and its optimizer
// prepared in two later calls: under stage 2 each model's gradients go to its own optimizer's partitions (a model
// is bound when its optimizer is prepared), and both train as under DDP.
void two_models() {
  auto run = [](auto& acc, torch::nn::Sequential& a, torch::nn::Sequential& b) {
    auto [ma, oa] =
        acc.prepare(a, std::make_shared<torch::optim::Adam>(a->parameters(), torch::optim::AdamOptions(0.01)));
    auto mb = acc.prepare(b);
    auto ob =
        acc.prepare(std::make_shared<torch::optim::SGD>(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
    for (int s = 0; s < 6; ++s) {
      auto scope = acc.accumulate(ma, mb);
      const at::Tensor x = batch_x(s, acc.process_index());
      acc.backward(torch::mse_loss(mb(at::tanh(ma(x)).narrow(1, 0, 3).repeat({1, 2}).narrow(1, 0, 5)),
                                   batch_y(s, acc.process_index())));
      oa.step(), ob.step();
      oa.zero_grad(), ob.zero_grad();
    }
    return std::pair{oa.sharded() != nullptr, ob.sharded() != nullptr};
  };
  auto da = make_net(), db = make_net(), za = make_net(), zb = make_net();
  Ddp ddp{zero_options()};
  run(ddp, da, db);
  Zero2 zero{zero_options()};
  const auto sharded = run(zero, za, zb);
  check(sharded.first && sharded.second, "two models: both optimizers are sharded");
  const double diff = std::max(max_diff(da, za), max_diff(db, zb));
  check(diff < 1e-6,
        "two models, two optimizers, prepared apart: stage 2 equals DDP (max diff " + std::to_string(diff) + ")");
}

// Stage 2 with a 16-bit comm hook: the buckets travel in fp16/bf16 to their owners; training follows DDP with the
// same hook (the sums' order may differ in 16 bits: within 1e-4 after 8 steps).
void compressed(accel::CommHook hook, const std::string& name) {
  auto opts = zero_options();
  opts.comm_hook = hook;
  auto ddp_net = make_net(), zero_net = make_net();
  Ddp ddp{opts};
  auto [dm, dopt] = ddp.prepare(
      ddp_net, std::make_shared<torch::optim::SGD>(ddp_net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
  train(ddp, dm, dopt, 0, 8);
  Zero2 zero{opts};
  auto [zm, zopt] = zero.prepare(zero_net, std::make_shared<torch::optim::SGD>(
                                               zero_net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
  train(zero, zm, zopt, 0, 8);
  const double diff = max_diff(ddp_net, zero_net);
  check(diff < 1e-4, name + ": ZeRO stage 2 with the hook follows DDP with it (max diff " + std::to_string(diff) + ")");
  check(zm.distributed().gradient_bytes() == zopt.sharded()->total_numel() * 2,
        name + ": 2 bytes per gradient element travel");
}
}  // namespace

// An optimizer chosen at run time (std::shared_ptr<torch::optim::Optimizer>): sharded by its dynamic type, training
// equal to DDP's; a type ZeRO cannot shard is refused at prepare naming it.
template <class Zero>
void chosen_at_run_time(const std::string& name) {
  auto ddp_net = make_net();
  Ddp ddp{zero_options()};
  auto [dm, dopt] = ddp.prepare(ddp_net, make_opt<torch::optim::Adam>(ddp_net, torch::optim::AdamOptions(0.01)));
  train(ddp, dm, dopt, 0, 6);
  auto zero_net = make_net();
  Zero zero{zero_options()};
  std::shared_ptr<torch::optim::Optimizer> chosen =
      make_opt<torch::optim::Adam>(zero_net, torch::optim::AdamOptions(0.01));
  auto [zm, zopt] = zero.prepare(zero_net, chosen);
  check(zopt.sharded() != nullptr, name + ": a run-time optimizer is sharded");
  train(zero, zm, zopt, 0, 6);
  const double diff = max_diff(ddp_net, zero_net);
  check(diff < 1e-6, name + ": training with it equals DDP's (max diff " + std::to_string(diff) + ")");
  auto other = make_net();
  Zero refusing{zero_options()};
  std::shared_ptr<torch::optim::Optimizer> lbfgs = std::make_shared<torch::optim::LBFGS>(other->parameters());
  std::string message;
  try {
    (void)refusing.prepare(other, lbfgs);
  } catch (const std::exception& e) {
    message = e.what();
  }
  check(message.find("torch::optim::LBFGS") != std::string::npos,
        name + ": an LBFGS chosen at run time is refused naming it (" + message + ")");
}

void zero(const Args& args) {
  const std::string scratch = arg(args, 0, ".");
  std::filesystem::create_directories(scratch);
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  exact<Zero1, torch::optim::SGD>("sgd", torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01), scratch);
  exact<Zero1, torch::optim::Adam>("adam", torch::optim::AdamOptions(0.01).amsgrad(true), scratch);
  exact<Zero1, torch::optim::AdamW>("adamw", torch::optim::AdamWOptions(0.01).weight_decay(0.1), scratch);
  exact<Zero1, torch::optim::RMSprop>("rmsprop", torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true),
                                      scratch);
  exact<Zero1, torch::optim::Adagrad>("adagrad", torch::optim::AdagradOptions(0.1), scratch);
  exact<Zero2, torch::optim::SGD>("sgd", torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01), scratch);
  exact<Zero2, torch::optim::Adam>("adam", torch::optim::AdamOptions(0.01).amsgrad(true), scratch);
  exact<Zero2, torch::optim::AdamW>("adamw", torch::optim::AdamWOptions(0.01).weight_decay(0.1), scratch);
  exact<Zero2, torch::optim::RMSprop>("rmsprop", torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true),
                                      scratch);
  exact<Zero2, torch::optim::Adagrad>("adagrad", torch::optim::AdagradOptions(0.1), scratch);
  two_models();
  chosen_at_run_time<Zero1>("run-time optimizer, stage 1");
  chosen_at_run_time<Zero2>("run-time optimizer, stage 2");
  scaled<Zero1>("grad scaler, stage 1");
  scaled<Zero2>("grad scaler, stage 2");
  compressed(accel::CommHook::fp16, "fp16 hook");
  compressed(accel::CommHook::bf16, "bf16 hook");

  auto* comm = state.comm();
  auto expect_error = [](const std::string& what, const std::string& needle, const std::function<void()>& f) {
    try {
      f();
      check(false, what + ": refused");
    } catch (const std::exception& e) {
      check(std::string(e.what()).find(needle) != std::string::npos,
            what + ": the message says why (" + e.what() + ")");
    }
  };
  // A parameter without a gradient at a step.
  {
    auto net = make_net();
    Zero1 acc{zero_options()};
    auto [m, o] =
        acc.prepare(net, std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01)));
    expect_error("a step without gradients", "has no gradient at this step", [&] { o.sharded()->step(); });
  }
  // Stage 2: a trainable parameter of the model in no optimizer (its gradient would have no owner).
  {
    auto net = make_net();
    Zero2 acc{zero_options()};
    auto first_layer = net[0]->parameters();
    expect_error("stage 2, a parameter outside the optimizer", "gradient has no owner", [&] {
      auto prepared = acc.prepare(net, std::make_shared<torch::optim::SGD>(first_layer, torch::optim::SGDOptions(0.1)));
    });
  }
  // A frozen parameter in the optimizer; an optimizer that already stepped.
  {
    auto net = make_net();
    net->parameters()[1].set_requires_grad(false);
    auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    accel::ShardedOptimizer frozen(opt, comm);
    expect_error("a frozen parameter", "does not require a gradient", [&] { frozen.build(); });
  }
  {
    auto net = make_net();
    auto opt = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
    for (auto& p : net->parameters()) p.mutable_grad() = at::ones_like(p);
    opt->step();
    accel::ShardedOptimizer stepped(opt, comm);
    expect_error("an optimizer with state", "already has state", [&] { stepped.build(); });
  }
  // Mismatched partitions at load: another parameter space.
  {
    auto net = make_net();
    accel::ShardedOptimizer a(std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01)),
                              comm);
    a.build();
    torch::serialize::OutputArchive out;
    a.save(out);
    const auto file = std::filesystem::path(scratch) / ("partition_rank" + std::to_string(tally.rank) + ".pt");
    out.save_to(file.string());
    auto other = torch::nn::Linear(5, 4);
    accel::ShardedOptimizer b(
        std::make_shared<torch::optim::Adam>(other->parameters(), torch::optim::AdamOptions(0.01)), comm);
    b.build();
    torch::serialize::InputArchive in;
    in.load_from(file.string());
    expect_error("mismatched partitions", "mismatched partitions", [&] { b.load(in); });
  }
}

}  // namespace mp
