// Full sharding (accel::shard::parameters, model/unit_sharder.hpp) against PyTorch's FSDP2 (`fully_shard` on each
// Linear and the root; tests/golden/generate_fsdp.py, which also checks it against DDP): the same initial
// parameters, batches and optimizer give every step's losses, clipping norms and full parameters, and the final
// optimizer state (each rank's piece of it), to 1e-6 on 2 and 3 processes (3 pads every unit). Also: each rank
// keeps about 1/N of the model, nothing stays gathered between steps, a forward that bypasses the prepared model
// stops the job saying why (`fsdp-bypass`, run by expect.sh), checkpoints resume exactly, and bad unit layouts are
// refused naming the module.
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/optim/schedulers.hpp>

#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

namespace mp {
namespace {

using Fsdp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::shard::parameters>;

at::Tensor floats(const nlohmann::json& v) { return at::tensor(v.get<std::vector<double>>(), at::kDouble); }

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::Tanh(), torch::nn::Linear(10, 10),
                               torch::nn::Tanh(), torch::nn::Linear(10, 4));
}

void load_init(torch::nn::Sequential& net, const nlohmann::json& init) {
  torch::NoGradGuard g;
  for (auto& p : net->named_parameters())
    p.value().copy_(floats(init.at(p.key()).at("values")).view(p.value().sizes()));
}

// The largest difference between the model's full parameters and `want` (read inside a gathered scope).
double worst(Fsdp& acc, const accel::PreparedModel<torch::nn::Sequential>& model, const nlohmann::json& want) {
  auto full = acc.gather_parameters(model);
  double w = 0;
  for (const auto& p : model->named_parameters())
    w = std::max(w,
                 (p.value().detach().to(at::kDouble).flatten() - floats(want.at(p.key()))).abs().max().item<double>());
  return w;
}

// Every parameter of a prepared model, flattened into one tensor: read whole inside a gathered scope (collective).
template <class Acc, class Model>
at::Tensor flat_parameters(Acc& acc, const Model& model) {
  const auto full = acc.gather_parameters(model);
  std::vector<at::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().flatten().clone());
  return torch::cat(flat);
}

// One golden case; `mixed`: under MixedPrecisionPolicy{bf16 parameters, fp32 reduction} (fsdp_mixed.json), the
// loss taken in fp32 of the bf16 output, compared within `tol`.
template <class Opt>
void run_case(const nlohmann::json& c, bool mixed = false, double tol = 1e-6) {
  const std::string name = c.at("optimizer").at("name").get<std::string>() + " " + c.at("variant").get<std::string>() +
                           (mixed ? " (bf16 parameters)" : "");
  const int micro = c.at("micro_batches");
  accel::MixedPrecisionPolicy policy;
  if (mixed) policy = {.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat};
  Fsdp acc{accel::Options{.gradient_accumulation_steps = micro,
                          .scheduler_steps_once = true,
                          .sharding = {.units = {"0", "2", "4"}, .mp_policy = policy},
                          .comm = options(60000).comm}};
  const int rank = acc.process_index();
  tally.rank = rank;
  auto net = mlp();
  load_init(net, c.at("init"));
  const auto& o = c.at("optimizer").at("options");
  std::shared_ptr<Opt> raw;
  if constexpr (std::is_same_v<Opt, torch::optim::SGD>)
    raw = std::make_shared<Opt>(
        net->parameters(), torch::optim::SGDOptions(o.at("lr").get<double>()).momentum(o.at("momentum").get<double>()));
  else
    raw = std::make_shared<Opt>(
        net->parameters(),
        torch::optim::AdamWOptions(o.at("lr").get<double>()).weight_decay(o.at("weight_decay").get<double>()));
  auto [model, opt] = acc.prepare(net, raw);
  std::shared_ptr<accel::StepLR> sched_raw;
  std::optional<accel::AcceleratedScheduler<accel::StepLR>> sched;
  if (c.contains("scheduler")) {
    const auto& so = c.at("scheduler").at("options");
    sched_raw = std::make_shared<accel::StepLR>(
        *raw, accel::StepLROptions{.step_size = so.at("step_size").get<std::int64_t>(), .gamma = so.at("gamma")});
    sched.emplace(acc.prepare(sched_raw));
  }
  const auto sharder = model.distributed().sharder();
  check(sharder && sharder->units().size() == 4, name + ": three units and the root");
  check(sharder->gathered_bytes() == 0, name + ": nothing gathered after prepare");
  double loss_err = 0, param_err = 0, clip_err = 0;
  for (const auto& step : c.at("steps")) {
    for (int m = 0; m < micro; ++m) {
      const auto& b = step.at("batches").at(std::size_t(rank)).at(std::size_t(m));
      const at::Tensor x = floats(b.at("x")).to(at::kFloat).view({-1, 6}),
                       y = floats(b.at("y")).to(at::kFloat).view({-1, 4});
      auto scope = acc.accumulate(model);
      const at::Tensor out = model(x);
      if (mixed) check(out.scalar_type() == at::kBFloat16, name + ": the forward computes in bf16");
      const at::Tensor loss = torch::mse_loss(out.to(at::kFloat), y);
      loss_err = std::max(loss_err, std::abs(loss.item<double>() -
                                             step.at("losses").at(std::size_t(rank)).at(std::size_t(m)).get<double>()));
      acc.backward(loss);
      if (c.contains("clip") && acc.sync_gradients()) {
        const double norm = acc.clip_grad_norm_(model, c.at("clip").at("max_norm").get<double>());
        clip_err = std::max(clip_err, std::abs(norm - step.at("clip_norm").get<double>()));
      }
      opt.step();
      if (sched) sched->step();
      opt.zero_grad();
    }
    check(sharder->gathered_bytes() == 0, name + ": nothing stays gathered after a step");
    param_err = std::max(param_err, worst(acc, model, step.at("params")));
  }
  check(loss_err < tol, name + ": every rank's losses equal fully_shard's (" + std::to_string(loss_err) + ")");
  check(param_err < tol,
        name + ": the full parameters after every step equal fully_shard's (" + std::to_string(param_err) + ")");
  if (c.contains("clip"))
    check(clip_err < tol,
          name + ": clip_grad_norm_ returns fully_shard's total norm (" + std::to_string(clip_err) + ")");
  // The final optimizer state: each rank's piece of every parameter's.
  double state_err = 0;
  auto& inner = opt.sharded()->inner();
  for (const auto& p : net->named_parameters()) {
    const auto* piece = sharder->piece_of(p.value());
    if (!piece || !piece->shard.defined()) continue;
    const auto it = inner.state().find(piece->shard.unsafeGetTensorImpl());
    if (it == inner.state().end()) {
      state_err = 1;
      continue;
    }
    const auto& want = c.at("final_state").at(p.key());
    auto cmp = [&](const at::Tensor& got, const char* key) {
      const at::Tensor w = floats(want.at(key)).narrow(0, piece->at, piece->numel);
      state_err = std::max(state_err, (got.to(at::kDouble).flatten() - w).abs().max().item<double>());
    };
    if constexpr (std::is_same_v<Opt, torch::optim::SGD>) {
      cmp(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer(), "momentum_buffer");
    } else {
      const auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      cmp(s.exp_avg(), "exp_avg");
      cmp(s.exp_avg_sq(), "exp_avg_sq");
      state_err = std::max(state_err, std::abs(double(s.step()) - want.at("step").get<double>()));
    }
  }
  check(state_err < tol,
        name + ": this rank's part of the optimizer state equals fully_shard's (" + std::to_string(state_err) + ")");
}

}  // namespace

void fully_sharded(const Args& args) {
  std::ifstream in(arg(args, 0, "fsdp.json"));
  const auto golden = nlohmann::json::parse(in);
  int cases = 0;
  for (const auto& c : golden.at("cases")) {
    if (c.at("world_size").get<int>() != accel::detect_launch_env().world_size) continue;
    if (c.at("optimizer").at("name") == "SGD")
      run_case<torch::optim::SGD>(c);
    else
      run_case<torch::optim::AdamW>(c);
    ++cases;
  }
  check(cases == 8, "eight golden cases for this number of processes (" + std::to_string(cases) + ")");
}

// Under MixedPrecisionPolicy{bf16 parameters, fp32 reduction}: fully_shard's trajectories with the same policy
// (tests/golden/generate_fsdp_mixed.py), which are up to 2e-2 from fp32 training's (bf16 matters), within 1e-6: the
// same casts at the same places (the shard cast before the all-gather, fp32 gradients accumulated and averaged).
void fully_sharded_mixed(const Args& args) {
  std::ifstream in(arg(args, 0, "fsdp_mixed.json"));
  const auto golden = nlohmann::json::parse(in);
  const double tol = 1e-6;
  int cases = 0;
  for (const auto& c : golden.at("cases")) {
    if (c.at("world_size").get<int>() != accel::detect_launch_env().world_size) continue;
    if (c.at("optimizer").at("name") == "SGD")
      run_case<torch::optim::SGD>(c, true, tol);
    else
      run_case<torch::optim::AdamW>(c, true, tol);
    ++cases;
  }
  check(cases >= 4, "the mixed-precision golden cases for this number of processes (" + std::to_string(cases) + ")");
}

// What each rank keeps, what a bypassing forward does, a checkpoint's round trip, and the unit layouts refused.
void fully_sharded_edges(const Args& args) {
  const std::filesystem::path dir = arg(args, 0, "fsdp-edges");
  Fsdp acc{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = options(60000).comm}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  torch::manual_seed(3);
  auto net = mlp();
  std::int64_t total = 0;
  for (const auto& p : net->parameters()) total += p.numel();
  auto raw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, raw);
  const auto sharder = model.distributed().sharder();
  // Units of 70, 110 and 44 elements: each rank keeps ceil(n / N) of each, for parameters and gradients.
  std::int64_t expect = 0;
  for (std::int64_t n : {70, 110, 44}) expect += (n + N - 1) / N;
  check(sharder->shard_bytes() == 2 * expect * 4, "each rank keeps its shards of the parameters and gradients only");
  check(total == 224, "the model's elements");
  const at::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 4});
  for (int s = 0; s < 3; ++s) {
    sharder->reset_peak();
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    // At most the root (nothing) and two units gathered at once: the largest two are 110 and 70 elements.
    check(
        sharder->peak_gathered_bytes() <= (110 + 70 + 2 * N) * 4,
        "at most two units gathered at once in a step (" + std::to_string(sharder->peak_gathered_bytes()) + " bytes)");
  }
  // Prefetching (Note [Prefetching the next unit]): the forward's order of units is recorded (units [1], [2] and
  // [3] are "0", "2" and "4"), and the backward's: the last unit first, and no "0", whose weights its backward does
  // not read (the input needs no gradient). A step then prefetches "2" and "4" in its forward and "2" in its
  // backward, and every prefetched unit is used; still at most two units gathered at once.
  using Order = std::vector<std::size_t>;
  check(sharder->forward_order() == Order{1, 2, 3}, "the forward's order of units is recorded");
  check(sharder->backward_order() == Order{3, 2}, "the backward's order of units is recorded");
  {
    const auto started = sharder->prefetches(), used = sharder->prefetches_used();
    sharder->reset_peak();
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    check(sharder->prefetches() - started == 3,
          "a step prefetches three units (" + std::to_string(sharder->prefetches() - started) + ")");
    check(sharder->prefetches_used() - used == 3, "every prefetched unit is used");
    check(sharder->peak_gathered_bytes() <= (110 + 70 + 2 * N) * 4, "prefetching gathers at most two units at once");
    check(sharder->gathered_bytes() == 0, "nothing stays gathered (or in flight) after a prefetching step");
  }
  // Prefetching changes only when the all-gathers run: the same steps without it give the same parameters, bit for
  // bit, and prefetch nothing.
  {
    auto train = [&](bool prefetch) {
      Fsdp a{accel::Options{
          .sharding = {.units = {"0", "2", "4"}, .forward_prefetch = prefetch, .backward_prefetch = prefetch},
          .comm = options(60000).comm}};
      torch::manual_seed(9);
      auto m = mlp();
      auto o = std::make_shared<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.01));
      auto [pm, po] = a.prepare(m, o);
      torch::manual_seed(40 + a.process_index());
      for (int k = 0; k < 4; ++k) {
        const at::Tensor xb = torch::randn({4, 6}), yb = torch::randn({4, 4});
        a.backward(torch::mse_loss(pm(xb), yb));
        po.step();
        po.zero_grad();
      }
      check((pm.distributed().sharder()->prefetches() > 0) == prefetch,
            std::string(prefetch ? "with" : "without") + " prefetching: units prefetched or not");
      return flat_parameters(a, pm);
    };
    const at::Tensor off = train(false), on = train(true);
    check(at::equal(off, on), "with and without prefetching: the same parameters, bit for bit");
  }
  // A checkpoint: two steps after it, loaded back, the same two steps give the same parameters bit for bit (the
  // model is loaded into the shards, the optimizer's pieces restored), and the parameters stay sharded.
  acc.save_state(dir);
  auto two_steps = [&] {
    for (int s = 0; s < 2; ++s) {
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
    }
    return flat_parameters(acc, model);
  };
  const at::Tensor first = two_steps();
  acc.load_state(dir);
  check(sharder->gathered_bytes() == 0, "load_state leaves the model sharded");
  const at::Tensor again = two_steps();
  check(at::equal(first, again), "resumed from the checkpoint, the same steps give the same parameters");
  // Weights loaded by LibTorch's own torch::load inside gather_parameters(model, true) (its archive gives each
  // parameter new memory) go into the shards: the prepared model then computes what a plain one with them does.
  torch::manual_seed(5);
  auto other = mlp();
  const auto file = dir / ("other_rank" + std::to_string(tally.rank) + ".pt");
  torch::save(other, file.string());
  {
    auto full = acc.gather_parameters(model, /*write_back=*/true);
    torch::load(net, file.string());
  }
  check(sharder->gathered_bytes() == 0, "the loaded model is sharded again");
  {
    torch::NoGradGuard no_grad;
    const at::Tensor probe = torch::randn({3, 6});
    check(at::equal(model(probe), other->forward(probe)), "a model loaded by torch::load into the gathered parameters");
  }
  // The checkpoint into a model cut into other units: refused before anything is restored.
  {
    Fsdp other{accel::Options{.sharding = {.units = {"2"}}, .comm = options(60000).comm}};
    auto m = mlp();
    auto o = std::make_shared<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.01));
    auto prepared = other.prepare(m, o);
    std::string message;
    try {
      other.load_state(dir);
    } catch (const std::exception& e) {
      message = e.what();
    }
    check(
        message.find("mismatched units") != std::string::npos && message.find("Options::sharding") != std::string::npos,
        "a checkpoint of other units is refused naming the fix (" + message + ")");
  }
  // bf16 autocast (Options::mixed_precision): the casts of the parameters gather them like any operator; training
  // equals DDP's under the same autocast.
  {
    using Ddp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;
    auto run = [&](auto& a, torch::nn::Sequential& m) {
      auto o = std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
      auto [pm, po] = a.prepare(m, o);
      torch::manual_seed(21 + a.process_index());
      for (int s = 0; s < 3; ++s) {
        const at::Tensor xb = torch::randn({4, 6}), yb = torch::randn({4, 4});
        at::Tensor loss;
        {
          auto cast = a.autocast();
          loss = torch::mse_loss(pm(xb), yb).to(at::kFloat);
        }
        a.backward(loss);
        po.step();
        po.zero_grad();
      }
      return flat_parameters(a, pm);
    };
    torch::manual_seed(8);
    auto m1 = mlp();
    torch::manual_seed(8);
    auto m2 = mlp();
    Ddp ddp{accel::Options{.mixed_precision = accel::Precision::bf16, .comm = options(60000).comm}};
    Fsdp fsdp{accel::Options{.mixed_precision = accel::Precision::bf16,
                             .sharding = {.units = {"0", "2", "4"}},
                             .comm = options(60000).comm}};
    const at::Tensor a = run(ddp, m1), b = run(fsdp, m2);
    const double diff = (a - b).abs().max().item<double>();
    check(diff < 1e-5, "bf16 autocast: full sharding trains as DDP does (max diff " + std::to_string(diff) + ")");
  }
  // Every optimizer ZeRO shards steps the pieces as DDP steps the whole parameters (SGD and AdamW: the golden
  // cases), and clip_grad_value_ clips each element of the gradient shards as DDP clips the whole gradients.
  {
    using Ddp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;
    auto versus_ddp = [&](auto make, const std::string& what, double clip_value) {
      auto run = [&](auto& a, torch::nn::Sequential& m) {
        auto [pm, po] = a.prepare(m, make(m->parameters()));
        torch::manual_seed(31 + a.process_index());
        for (int s = 0; s < 3; ++s) {
          a.backward(torch::mse_loss(pm(torch::randn({4, 6})), torch::randn({4, 4})));
          if (clip_value > 0) a.clip_grad_value_(pm, clip_value);
          po.step();
          po.zero_grad();
        }
        return flat_parameters(a, pm);
      };
      torch::manual_seed(9);
      auto m1 = mlp();
      torch::manual_seed(9);
      auto m2 = mlp();
      Ddp ddp{accel::Options{.comm = options(60000).comm}};
      Fsdp fsdp{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = options(60000).comm}};
      const at::Tensor a = run(ddp, m1), b = run(fsdp, m2);
      const double diff = (a - b).abs().max().item<double>();
      check(diff < 1e-6, what + " under full sharding equals DDP (max diff " + std::to_string(diff) + ")");
    };
    using Params = std::vector<at::Tensor>;
    versus_ddp([](Params p) { return torch::optim::SGD(p, torch::optim::SGDOptions(0.1)); }, "clip_grad_value_", 0.02);
    versus_ddp([](Params p) { return torch::optim::Adam(p, torch::optim::AdamOptions(0.01)); }, "Adam", 0);
    versus_ddp([](Params p) { return torch::optim::RMSprop(p, torch::optim::RMSpropOptions(0.01)); }, "RMSprop", 0);
    versus_ddp([](Params p) { return torch::optim::Adagrad(p, torch::optim::AdagradOptions(0.1)); }, "Adagrad", 0);
  }
  // A second backward through a retained graph (loss.backward({}, true), then again) gathers each unit again and
  // accumulates its gradients onto the first's, as FSDP2 does (its gradients double): a step after the two backwards
  // equals, bit for bit, a step after one backward of twice the loss, and DDP's after the same two backwards.
  {
    using Ddp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;
    auto run = [&](auto& a, bool twice) {
      torch::manual_seed(12);
      auto m = mlp();
      auto [pm, po] = a.prepare(m, torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.1)));
      torch::manual_seed(13 + a.process_index());
      for (int s = 0; s < 2; ++s) {
        const at::Tensor loss = torch::mse_loss(pm(torch::randn({4, 6})), torch::randn({4, 4}));
        if (twice) {
          loss.backward({}, /*retain_graph=*/true);
          loss.backward();
        } else {
          (loss * 2).backward();
        }
        po.step();
        po.zero_grad();
      }
      return flat_parameters(a, pm);
    };
    Fsdp f1{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = options(60000).comm}};
    Fsdp f2{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = options(60000).comm}};
    Ddp d{accel::Options{.comm = options(60000).comm}};
    const at::Tensor twice = run(f1, true), doubled = run(f2, false), ddp = run(d, true);
    check(same(twice, doubled),
          "a second backward through a retained graph accumulates as a backward of twice the loss");
    const double diff = (twice - ddp).abs().max().item<double>();
    check(diff < 1e-6, "a second backward through a retained graph: full sharding equals DDP (max diff " +
                           std::to_string(diff) + ")");
    // With buffers (the door broadcasts them before each forward), a backward that kept its graph leaves the door
    // open to the next backward through it, under DDP and full sharding; a forward around the door after a backward
    // that did not keep it is still refused (mp.fsdp.bypass_stops, and DDP's bypass tests).
    auto with_buffers = [&](auto& a, bool twice2) {
      torch::manual_seed(15);
      auto m = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 4));
      auto [pm, po] = a.prepare(m, torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.1)));
      torch::manual_seed(16 + a.process_index());
      const at::Tensor loss = pm(torch::randn({4, 6})).pow(2).sum();
      if (twice2) {
        loss.backward({}, /*retain_graph=*/true);
        loss.backward();
      } else {
        (loss * 2).backward();
      }
      po.step();
      return flat_parameters(a, pm);
    };
    Fsdp f3{accel::Options{.sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
    Fsdp f4{accel::Options{.sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
    Ddp d2{accel::Options{.comm = options(60000).comm}};
    Ddp d3{accel::Options{.comm = options(60000).comm}};
    const at::Tensor a2 = with_buffers(f3, true), b2 = with_buffers(f4, false);
    const at::Tensor c2 = with_buffers(d2, true), e2 = with_buffers(d3, false);
    // (Within 1e-6, not bit for bit: DDP all-reduces the second backward's gradients onto the first's average.)
    const double d_full = (a2 - b2).abs().max().item<double>(), d_ddp = (c2 - e2).abs().max().item<double>();
    check(d_full < 1e-6 && d_ddp < 1e-6,
          "with buffers: a second backward through a retained graph accumulates as a backward of twice the loss "
          "(full sharding and DDP; max diff " +
              std::to_string(d_full) + ", " + std::to_string(d_ddp) + ")");
  }
  // torch::autograd::grad with respect to the input, through a graph the backward kept: the units are gathered again
  // for it (as for a second backward), no parameter's gradient accumulates, and they are freed at its end.
  {
    Fsdp other{accel::Options{.sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
    torch::manual_seed(14);
    auto plain = mlp();
    torch::manual_seed(14);
    auto m = mlp();
    auto pm = other.prepare(m);
    const at::Tensor x = torch::randn({4, 6}).requires_grad_(true);
    const at::Tensor loss = pm(x).pow(2).sum();
    loss.backward({}, /*retain_graph=*/true);
    const auto gx = torch::autograd::grad({loss}, {x});
    const at::Tensor x2 = x.detach().clone().requires_grad_(true);
    const auto want = torch::autograd::grad({plain->forward(x2).pow(2).sum()}, {x2});
    check(at::allclose(gx[0], want[0], 1e-6, 1e-6) && pm.distributed().sharder()->gathered_bytes() == 0,
          "autograd::grad of the input through a retained graph: the plain model's gradient, nothing left gathered");
  }
  // Every process starts from rank 0's values: each unit is broadcast from rank 0 as it is cut (Note [Sharding onto
  // the device unit by unit]; the construction's broadcast of every parameter is skipped under full sharding), here
  // with a model built differently on every rank.
  {
    torch::manual_seed(5);
    auto rank0 = mlp();
    torch::manual_seed(5 + acc.process_index());
    auto own = mlp();
    Fsdp other{accel::Options{.sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
    auto prepared = other.prepare(own);
    std::vector<at::Tensor> want;
    for (const auto& p : rank0->parameters()) want.push_back(p.detach().flatten());
    check(same(flat_parameters(other, prepared), torch::cat(want)),
          "every process's full parameters are rank 0's after prepare (units and the root unit)");
  }
  // The GradScaler (fp16's; it runs on the CPU too, where fp16 autocast does not) unscales, checks and steps the
  // gradient shards through the sharded optimizer: with a power-of-two scale the unscaled shards are exact, so the
  // training equals DDP's with the same scaler; an inf in one gradient element that only the last rank holds (after
  // the reduce-scatter) skips that step on every rank, and the scale backs off once, as under DDP.
  {
    using Ddp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;
    auto run = [&](auto& a, torch::nn::Sequential& m) {
      auto [pm, po] = a.prepare(m, torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.1)));
      auto scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU), a.comm(),
                                                        accel::GradScalerOptions{.init_scale = 1024.0});
      accel::AcceleratedOptimizer<torch::optim::SGD> scaled(po.shared(), scaler);
      scaled.set_sharded(po.sharded());
      torch::optim::Optimizer& holder =
          po.sharded() ? po.sharded()->gradient_holder() : static_cast<torch::optim::Optimizer&>(po.inner());
      torch::manual_seed(41 + a.process_index());
      std::string skipped;
      for (int s = 0; s < 3; ++s) {
        a.backward(scaler->scale(torch::mse_loss(pm(torch::randn({4, 6})), torch::randn({4, 4}))));
        if (s == 1 && a.process_index() == a.num_processes() - 1)
          for (auto& p : holder.param_groups()[0].params())
            if (p.grad().defined() && p.grad().numel() > 0) {
              p.grad().reshape({-1})[0].fill_(std::numeric_limits<float>::infinity());
              break;
            }
        scaled.step();
        skipped += scaled.step_was_skipped() ? "s" : "-";
        scaled.zero_grad();
      }
      return std::tuple{flat_parameters(a, pm), skipped, scaler->get_scale()};
    };
    torch::manual_seed(10);
    auto m1 = mlp();
    torch::manual_seed(10);
    auto m2 = mlp();
    Ddp ddp{accel::Options{.comm = options(60000).comm}};
    Fsdp fsdp{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = options(60000).comm}};
    const auto [a, a_skipped, a_scale] = run(ddp, m1);
    const auto [b, b_skipped, b_scale] = run(fsdp, m2);
    check(a_skipped == "-s-" && b_skipped == "-s-", "GradScaler: one rank's inf skips that step on every rank (DDP " +
                                                        a_skipped + ", full sharding " + b_skipped + ")");
    check(a_scale == 512.0 && b_scale == 512.0, "GradScaler: the scale backed off once under both");
    const double diff = (a - b).abs().max().item<double>();
    check(diff < 1e-6,
          "GradScaler: full sharding trains as DDP does with the same scaler (max diff " + std::to_string(diff) + ")");
  }
  // Bad unit layouts, refused at prepare naming the module.
  auto refused = [&](accel::ShardingOptions so, const std::string& needle, const std::string& what,
                     bool freeze_first = false) {
    Fsdp other{accel::Options{.sharding = std::move(so), .comm = options(60000).comm}};
    auto m = mlp();
    if (freeze_first) m[0]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
    std::string message;
    try {
      (void)other.prepare(m);
    } catch (const std::exception& e) {
      message = e.what();
    }
    check(message.find(needle) != std::string::npos, what + " (" + message + ")");
  };
  refused({.units = {"7"}}, "'7' is not a submodule of the model", "a unit that is not a submodule");
  refused({.units = {"0"}}, "mixes frozen and trainable parameters", "a unit mixing frozen and trainable parameters",
          true);
  refused({.units = {"1"}}, "unit '1' holds no parameter", "a unit without parameters");
}

// A peer killed while the others wait for a prefetched all-gather (unit "2"'s, started when unit "0" was gathered):
// the last rank, which does not prefetch (issuing the same collectives, later), dies between the two units of its
// second forward, before it takes part in that all-gather. The others must end with that all-gather's error, naming
// the dead rank (run by expect.sh), not with the operator's error on the unit without memory, and never hang.
void fully_sharded_kill(const Args&) {
  using Victim = accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::shard::parameters>;
  const auto env = accel::detect_launch_env();
  const bool victim = env.rank == env.world_size - 1;
  Victim acc{
      accel::Options{.sharding = {.units = {"0", "2"}, .forward_prefetch = !victim}, .comm = options(20000).comm}};
  tally.rank = acc.process_index();
  int forwards = 0;
  auto net = torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::Functional([&](const at::Tensor& h) {
                                     if (victim && forwards == 2) {
                                       std::this_thread::sleep_for(std::chrono::milliseconds(500));  // "0" delivered
                                       ::raise(SIGKILL);
                                     }
                                     return torch::tanh(h);
                                   }),
                                   torch::nn::Linear(10, 10));
  auto model = acc.prepare(net);
  torch::NoGradGuard no_grad;
  for (forwards = 1; forwards <= 3; ++forwards) (void)model(torch::randn({2, 6}));
  check(false, "survived a peer killed during a prefetched all-gather");
}

// A forward around the prepared model (model->forward(x), LibTorch's habit) reads freed parameters: every rank
// stops with the message that says what to call instead, never computes on freed memory.
void fully_sharded_bypass(const Args&) {
  Fsdp acc{accel::Options{.sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
  tally.rank = acc.process_index();
  auto net = mlp();
  auto model = acc.prepare(net);
  mark("prepared");
  (void)model->forward(torch::randn({2, 6}));
  check(false, "model->forward(x) ran on freed parameters");
}

// Sharded checkpoints (StateDictType::sharded, the default): each process writes and reads its own shards, nothing
// is gathered, and the job resumes bit for bit; a whole model.pt (StateDictType::full, or an unsharded job's) loads
// into a sharded model and the reverse is refused naming the fix.
void fully_sharded_checkpoints(const Args& args) {
  const std::filesystem::path dir = arg(args, 0, "fsdp-checkpoints");
  const auto comm = options(60000).comm;
  Fsdp acc{accel::Options{.sharding = {.units = {"0", "2", "4"}}, .comm = comm}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  torch::manual_seed(3);
  auto net = mlp();
  auto raw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, raw);
  const auto sharder = model.distributed().sharder();
  const at::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 4});
  auto steps = [&](auto& a, auto& m, auto& o, int k) {
    for (int s = 0; s < k; ++s) {
      a.backward(torch::mse_loss(m(x), y));
      o.step();
      o.zero_grad();
    }
    return flat_parameters(a, m);
  };
  (void)steps(acc, model, opt, 2);
  const auto sharded_dir = dir / "sharded", full_dir = dir / "full";
  sharder->reset_peak();
  acc.save_state(sharded_dir);
  check(sharder->peak_gathered_bytes() == 0,
        "save_state gathers nothing (" + std::to_string(sharder->peak_gathered_bytes()) + " bytes gathered)");
  bool files = !std::filesystem::exists(sharded_dir / "model.pt");
  for (int r = 0; r < N; ++r)
    files = files && std::filesystem::exists(sharded_dir / ("model_0_rank" + std::to_string(r) + ".pt"));
  check(files, "each process wrote its own shards (model_0_rank<r>.pt), and no whole model.pt");
  const at::Tensor first = steps(acc, model, opt, 2);
  sharder->reset_peak();
  acc.load_state(sharded_dir);
  check(sharder->peak_gathered_bytes() == 0, "load_state of shards gathers nothing");
  check(at::equal(first, steps(acc, model, opt, 2)),
        "resumed from its shards, the same steps give the same parameters");
  // get_state_dict: the full state, built unit by unit on the main process only.
  {
    const at::Tensor full = flat_parameters(acc, model);
    sharder->reset_peak();
    const auto state = acc.get_state_dict(model);
    if (acc.is_main_process()) {
      std::vector<at::Tensor> flat;
      for (const auto& [name, t] : state) flat.push_back(t.flatten());
      check(state.size() == 6 && state[0].first == "0.weight" && at::equal(torch::cat(flat), full),
            "get_state_dict gives the main process the full parameters, by name");
    } else {
      check(state.empty(), "get_state_dict gives the other processes nothing");
    }
    check(sharder->peak_gathered_bytes() == 0, "get_state_dict leaves the model sharded");
  }

  // StateDictType::full: the whole model in model.pt (an unsharded job's file); it loads into the sharded job.
  {
    torch::manual_seed(3);
    auto net2 = mlp();
    Fsdp full{accel::Options{.sharding = {.units = {"0", "2", "4"}, .state_dict_type = accel::StateDictType::full},
                             .comm = comm}};
    auto raw2 = std::make_shared<torch::optim::AdamW>(net2->parameters(), torch::optim::AdamWOptions(0.01));
    auto [m2, o2] = full.prepare(net2, raw2);
    (void)steps(full, m2, o2, 2);
    full.save_state(full_dir);
    check(std::filesystem::exists(full_dir / "model.pt") && !std::filesystem::exists(full_dir / "model_0_rank0.pt"),
          "StateDictType::full writes the whole model.pt");
    const at::Tensor expect = steps(full, m2, o2, 2);
    // Loaded by the job that writes shards: the whole model goes into its shards; the same two steps follow.
    acc.load_state(full_dir);
    check(sharder->gathered_bytes() == 0, "a whole model.pt loaded into the sharded model leaves it sharded");
    check(at::equal(expect, steps(acc, model, opt, 2)), "a whole model.pt resumes the sharded job exactly");
    // And the job that writes whole models reads shards.
    full.load_state(sharded_dir);
    acc.load_state(sharded_dir);
    check(at::equal(steps(full, m2, o2, 2), steps(acc, model, opt, 2)),
          "StateDictType::full's job resumes from shards");
  }
  // An unsharded job cannot take a model's shards: refused before anything is restored, naming the fix.
  {
    using Ddp = accel::Accelerator<accel::dist::from_env, accel::batches::per_process>;
    Ddp ddp{accel::Options{.comm = comm}};
    auto m = mlp();
    auto o = std::make_shared<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.01));
    auto prepared = ddp.prepare(m, o);
    std::string message;
    try {
      ddp.load_state(sharded_dir);
    } catch (const std::exception& e) {
      message = e.what();
    }
    check(message.find("as the shards of") != std::string::npos &&
              message.find("accel::shard::parameters") != std::string::npos,
          "an unsharded job refuses a model's shards naming the fix (" + message + ")");
  }
  // A forged shard file (another rank's, as if copied over): refused naming the file, nothing restored.
  if (N > 1) {
    const auto forged = dir / "forged";
    if (acc.is_main_process()) {
      std::filesystem::remove_all(forged);
      std::filesystem::copy(sharded_dir, forged);
      std::filesystem::copy_file(forged / "model_0_rank1.pt", forged / "model_0_rank0.pt",
                                 std::filesystem::copy_options::overwrite_existing);
      accel::checkpoint::Manifest::of_directory(forged).write(forged);
    }
    acc.wait_for_everyone();
    const at::Tensor before = flat_parameters(acc, model);
    std::string message;
    try {
      acc.load_state(forged);
    } catch (const std::exception& e) {
      message = e.what();
    }
    if (acc.process_index() == 0)
      check(
          message.find("model_0_rank0.pt") != std::string::npos && message.find("rank 1's shards") != std::string::npos,
          "another rank's shard file is refused naming it (" + message + ")");
    else  // its own files are whole: it restores nothing either, and says which process refused and why
      check(message.find("another process refused the checkpoint, so none restores it: rank 0:") != std::string::npos &&
                message.find("model_0_rank0.pt") != std::string::npos,
            "the other processes stop too, naming rank 0's refusal (" + message + ")");
    check(at::equal(before, flat_parameters(acc, model)), "nothing restored from a refused checkpoint");
  }
}

}  // namespace mp
