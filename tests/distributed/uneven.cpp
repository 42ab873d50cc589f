// Uneven inputs joined from the plan (Note [Joined steps] in gradient_state.hpp), on real processes: training
// under tail::uneven equals PyTorch's Join semantics computed here on one process (a rank out of batches adds
// zeros to each remaining gradient all-reduce, the sum is divided by the initial world size), with and without
// accumulation; parameters, momentum and learning rate stay equal on every rank; gather_for_metrics over an uneven
// loader returns every real sample exactly once, as tensors and as objects; a trigger stops every rank together,
// also when the rank that sets it runs a step the others lack; a rank with no batch at all is a clear error on
// every rank. The same training under ZeRO stage 2 equals Join too (momentum compared consolidated).
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sort.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <string>
#include <vector>

namespace mp {
namespace {

struct Uneven : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::uneven> {};
// ZeRO stage 2 under uneven tails: the rank out of batches sends zeros to each bucket's owner and steps its partition.
struct UnevenZero2 : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::uneven,
                                        accel::shard::gradients> {};

auto make_net() { return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)); }

void copy_params(torch::nn::Module& to, torch::nn::Module& from) {
  torch::NoGradGuard g;
  auto dst = to.parameters();
  auto src = from.parameters();
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

// Every rank's copy of `t`, for equality across ranks.
bool equal_on_every_rank(accel::comm::Communicator* comm, const at::Tensor& t) {
  const auto all = comm->all_gather(t.detach().contiguous());
  for (const auto& a : all)
    if (!at::equal(a, all[0])) return false;
  return true;
}

// Trains `n` samples (batch B, no shuffling: rank r's j-th batch is global batch j*N + r) with accumulation `k`,
// momentum SGD, a StepLR and clipping on synchronising steps, and compares with the reference.
template <class Acc = Uneven>
void train(int k, std::int64_t n, std::int64_t B) {
  Acc acc{accel::Options{.gradient_accumulation_steps = k, .bucket_bytes = 200, .comm = options(60000).comm}};
  const int N = acc.num_processes(), me = acc.process_index();
  constexpr bool sharded = Acc::config::zero_stage > 0;
  const std::string what = std::string(sharded ? "ZeRO stage 2, " : "") + "N=" + std::to_string(N) +
                           " k=" + std::to_string(k) + " n=" + std::to_string(n) + ": ";
  at::manual_seed(11);
  const at::Tensor x = at::randn({n, 5}), y = at::randn({n, 2});
  auto net = make_net();
  auto reference = make_net();
  copy_params(*reference, *net);
  const double lr = 0.05, momentum = 0.9, max_norm = 0.5;
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  auto [model, opt, loader, sched] =
      acc.prepare(net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}),
                  std::make_shared<torch::optim::StepLR>(*sgd, 3, 0.5));
  const std::int64_t batches = (n + B - 1) / B;
  const std::int64_t mine = batches / N + (me < batches % N ? 1 : 0);
  const std::int64_t steps = (batches + N - 1) / N;
  check(std::int64_t(loader.size()) == mine, what + "this rank's batches");

  // The reference: Join's average over the ranks that have a batch at each step, divided by N.
  auto ref_sgd = torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  torch::optim::StepLR ref_sched(ref_sgd, 3, 0.5);
  ref_sgd.zero_grad();
  for (std::int64_t q = 0; q < steps; ++q) {
    for (int r = 0; r < N; ++r) {
      const std::int64_t g = q * N + r;
      if (g >= batches) continue;
      const std::int64_t rows = std::min(B, n - g * B);
      auto loss = torch::mse_loss(reference->forward(x.narrow(0, g * B, rows)), y.narrow(0, g * B, rows));
      (loss / double(k) / double(N)).backward();
    }
    if ((q + 1) % k == 0 || q + 1 == steps) {
      torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
      ref_sgd.step();
      for (int i = 0; i < N; ++i) ref_sched.step();  // batches::per_process: N scheduler steps per optimizer step
      ref_sgd.zero_grad();
    }
  }

  std::int64_t seen = 0, synced = 0;
  for (const auto& b : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    if (acc.sync_gradients()) acc.clip_grad_norm_(model, max_norm), ++synced;
    opt.step();
    sched.step();
    opt.zero_grad();
    ++seen;
  }
  check(seen == mine, what + "the loop saw this rank's batches only");
  check(acc.step() == 0, what + "the accumulation counter reset at the epoch's last step");
  bool close = true, equal = true;
  auto got = net->parameters();
  auto want = reference->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    close = close && at::allclose(got[i], want[i], 1e-5, 1e-6);
    equal = equal && equal_on_every_rank(acc.comm(), got[i]);
  }
  check(close, what + "parameters equal Join's (the reference)");
  check(equal, what + "parameters equal on every rank");
  bool momenta = true;
  if constexpr (sharded) {
    // The partitions' momentum, consolidated on rank 0, equals the reference's.
    opt.sharded()->consolidate(0);
    if (me == 0) {
      auto mine_p = net->parameters(), ref_p = reference->parameters();
      for (std::size_t i = 0; i < mine_p.size(); ++i) {
        auto& a = static_cast<torch::optim::SGDParamState&>(*sgd->state().at(mine_p[i].unsafeGetTensorImpl()));
        auto& b = static_cast<torch::optim::SGDParamState&>(*ref_sgd.state().at(ref_p[i].unsafeGetTensorImpl()));
        momenta = momenta && at::allclose(a.momentum_buffer(), b.momentum_buffer(), 1e-5, 1e-6);
      }
    }
    opt.sharded()->release_consolidated();
    check(momenta, what + "momentum (consolidated) equals Join's");
  } else {
    for (const auto& p : net->parameters()) {
      auto& state = static_cast<torch::optim::SGDParamState&>(*sgd->state().at(p.unsafeGetTensorImpl()));
      momenta = momenta && equal_on_every_rank(acc.comm(), state.momentum_buffer());
    }
    check(momenta, what + "momentum equal on every rank (the rank out of batches stepped too)");
  }
  const double my_lr = sgd->param_groups()[0].options().get_lr();
  check(my_lr == ref_sgd.param_groups()[0].options().get_lr(), what + "learning rate follows the scheduler");
  check(equal_on_every_rank(acc.comm(), at::tensor({my_lr}, at::kDouble)), what + "learning rate equal on every rank");

  // Evaluation over the same uneven loader: every real sample exactly once, on every rank.
  auto ids = at::arange(n, at::kLong);
  auto eval = acc.prepare(accel::data::DataLoader(accel::data::TensorDataset(x, ids), {.batch_size = B}));
  std::vector<at::Tensor> gathered;
  for (const auto& b : eval) gathered.push_back(acc.gather_for_metrics(b.target));
  const auto all = std::get<0>(at::sort(at::cat(gathered)));
  check(same(all, at::arange(n, at::kLong)), what + "gather_for_metrics: every sample exactly once (" +
                                                 std::to_string(all.size(0)) + " of " + std::to_string(n) + ")");
}

// check_trigger under uneven tails. Round 0: rank 1 sets the trigger at step 5, every rank stops at step 5. Round 1:
// rank 0 sets it at its last step, which the others lack: they repeat that step up to the check only (their loops
// had already ended), so no rank takes the optimizer step after it and parameters and momentum stay equal.
void triggers(std::int64_t n, std::int64_t B) {
  for (int round = 0; round < 2; ++round) {
    Uneven acc{accel::Options{.comm = options(60000).comm}};
    const int N = acc.num_processes(), me = acc.process_index();
    const std::string what = "trigger round " + std::to_string(round) + ", N=" + std::to_string(N) + ": ";
    at::manual_seed(21);
    auto net = make_net();
    auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto [model, opt, loader] = acc.prepare(
        net, sgd,
        accel::data::DataLoader(accel::data::TensorDataset(at::randn({n, 5}), at::randn({n, 2})), {.batch_size = B}));
    const std::int64_t mine = std::int64_t(loader.size());
    const std::int64_t longest = acc.reduce(at::tensor({mine}, at::kLong), accel::Reduction::max).item<std::int64_t>();
    check(round == 0 || (me == 0 ? mine == longest : mine == longest - 1), what + "rank 0 alone runs the last step");
    const int who = round == 0 ? 1 : 0;
    const std::int64_t when = round == 0 ? 5 : longest - 1;
    std::int64_t step = 0, stopped_at = -1;
    for (const auto& b : loader) {
      auto s = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(b.data), b.target));
      if (me == who && step == when) acc.set_trigger();
      if (acc.check_trigger()) {
        stopped_at = step;
        break;
      }
      opt.step();
      opt.zero_grad();
      ++step;
    }
    if (round == 0) {
      const auto stops = accel::gather_object(acc.comm(), stopped_at);
      check(std::all_of(stops.begin(), stops.end(), [](std::int64_t s) { return s == 5; }),
            what + "a trigger set on rank 1 at step 5 stops every rank at step 5 (this rank: " +
                std::to_string(stopped_at) + ")");
    } else {
      check(me == 0 ? stopped_at == longest - 1 : stopped_at == -1 && step == mine,
            what + "rank 0 stops at its last step, the others end their batches (stopped at " +
                std::to_string(stopped_at) + ")");
    }
    bool equal = true;
    for (const auto& p : net->parameters()) {
      equal = equal && equal_on_every_rank(acc.comm(), p);
      auto& state = static_cast<torch::optim::SGDParamState&>(*sgd->state().at(p.unsafeGetTensorImpl()));
      equal = equal && equal_on_every_rank(acc.comm(), state.momentum_buffer());
    }
    check(equal, what + "parameters and momentum equal on every rank (no rank stepped after the trigger)");
    check(!acc.check_trigger(), what + "the flag was reset on every rank");
  }
}

// gather_for_metrics of objects over an uneven loader: alone in the loop (the rank that runs out gathers the rows of
// the steps it lacks with its last batch), every sample exactly once on every rank; beside the tensor form (the
// rank that runs out repeats its steps), the same samples as the tensors, every sample once on the longest rank.
void evaluate_objects(std::int64_t n, std::int64_t B) {
  Uneven acc{accel::Options{.comm = options(60000).comm}};
  const std::string what = "objects, N=" + std::to_string(acc.num_processes()) + " n=" + std::to_string(n) + ": ";
  auto eval = acc.prepare(accel::data::DataLoader(
      accel::data::TensorDataset(at::randn({n, 2}), at::arange(n, at::kLong)), {.batch_size = B}));
  auto all = sample_names(at::arange(n, at::kLong));
  std::sort(all.begin(), all.end());
  std::vector<std::string> seen;
  for (const auto& b : eval) {
    const auto g = acc.gather_for_metrics(sample_names(b.target));
    seen.insert(seen.end(), g.begin(), g.end());
  }
  std::sort(seen.begin(), seen.end());
  check(seen == all,
        what + "alone: every sample exactly once (" + std::to_string(seen.size()) + " of " + std::to_string(n) + ")");
  seen.clear();
  bool as_tensors = true;
  for (const auto& b : eval) {
    const auto g = acc.gather_for_metrics(sample_names(b.target));
    as_tensors = as_tensors && g == sample_names(acc.gather_for_metrics(b.target));
    seen.insert(seen.end(), g.begin(), g.end());
  }
  std::sort(seen.begin(), seen.end());
  check(as_tensors, what + "beside tensors: the samples the tensor form keeps");
  check(std::adjacent_find(seen.begin(), seen.end()) == seen.end(), what + "beside tensors: no duplicate");
  if (acc.process_index() == 0) check(seen == all, what + "beside tensors: every sample once on the longest rank");
}

// A loader that gives the last rank no batch at all: every other rank stops at its first collective with the
// same error; the starved rank's loop is empty. Afterwards every rank meets again (nothing was left unmatched).
void starved() {
  using Acc = Uneven;
  Acc acc{accel::Options{.comm = options(60000).comm}};
  const int N = acc.num_processes(), me = acc.process_index();
  const std::int64_t B = 4, n = B * (N - 1);  // N - 1 batches
  auto net = make_net();
  auto [model, opt, loader] = acc.prepare(
      net, torch::optim::SGD(net->parameters(), 0.1),
      accel::data::DataLoader(accel::data::TensorDataset(at::randn({n, 5}), at::randn({n, 2})), {.batch_size = B}));
  std::string error;
  try {
    for (const auto& b : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(b.data), b.target));
      opt.step();
      opt.zero_grad();
    }
  } catch (const accel::InvalidArgument& e) {
    error = e.what();
  }
  if (me == N - 1)
    check(error.empty(), "the starved rank has no batch and no error");
  else
    check(error.find("gives rank " + std::to_string(N - 1) + " no batch at all") != std::string::npos &&
              error.find("tail::even") != std::string::npos,
          "the other ranks name the starved rank and the fix: " + error);
  acc.wait_for_everyone();
  mark("every rank met again after the starved epoch");
}

}  // namespace

void uneven(const Args&) {
  accel::ProcessState state(options(60000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  // 1000 samples of batch 16 on 2 processes: 32 and 31 batches (the case); 1010 on 3: 22, 21, 21 with a
  // last batch of 2 rows; and a case where the ranks differ by more than one step's worth of accumulation.
  train(1, N == 2 ? 1000 : 1010, 16);
  train(3, N == 2 ? 1000 : 1010, 16);
  train(4, 7 * N + 1, 1);  // batch 1: rank 0 runs 8 steps, the others 7 (a sync only on the joined last step)
  train<UnevenZero2>(3, N == 2 ? 1000 : 1010, 16);
  train<UnevenZero2>(4, 7 * N + 1, 1);
  triggers(N == 2 ? 1000 : 1010, 16);
  evaluate_objects(N == 2 ? 1000 : 1010, 16);
  starved();
}

}  // namespace mp
