// The Accelerator (accelerator.hpp) on real processes: a training loop equals one process on the concatenated batches;
// the helpers around the loop (triggers, clip_grad_value_, gather_for_metrics of objects, the on_* helpers).
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mp {

struct Trainer : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

// prepare + accumulate + backward equal one process on the concatenated batches; the scheduler steps N times per
// optimizer step; the GradScaler's overflow finding is shared by every rank.
void accelerator(const Args&) {
  Trainer acc{accel::Options{.gradient_accumulation_steps = 2, .bucket_bytes = 256, .comm = options(30000).comm}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  const std::int64_t B = 3, steps = 4;  // 4 optimizer steps of 2 micro-batches of B rows per process
  auto make = [] { return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)); };
  at::manual_seed(7);
  const at::Tensor x = at::randn({steps * 2 * N * B, 5}), y = at::randn({steps * 2 * N * B, 2});
  at::manual_seed(100 + tally.rank);  // different initial weights on every rank: prepare broadcasts rank 0's
  auto net = make();
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.2));
  auto [model, opt, loader, sched] =
      acc.prepare(net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}),
                  std::make_shared<torch::optim::StepLR>(*sgd, 1000));
  check(model.distributed().buckets() > 1, "several gradient buckets");
  auto reference = make();  // one process: the same start, one step on each 2*N*B consecutive rows
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD ref_opt(reference->parameters(), 0.2);
  for (std::int64_t s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x.narrow(0, s * 2 * N * B, 2 * N * B)), y.narrow(0, s * 2 * N * B, 2 * N * B))
        .backward();
    ref_opt.step();
  }
  int real_steps = 0;
  for (const auto& b : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    real_steps += acc.sync_gradients();
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  check(real_steps == steps, "one real optimizer step every 2 batches (" + std::to_string(real_steps) + ")");
  check(sched.steps() == steps * N, "the scheduler steps num_processes times per optimizer step");
  double worst = 0;
  auto a = net->parameters(), r = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - r[i]).abs().max().item<double>());
  check(worst < 1e-5, "prepare + accumulate + backward equal one process on the concatenated batches (max diff " +
                          std::to_string(worst) + ")");
  acc.print("Accelerator on ", N, " processes, 2-step accumulation: max parameter difference to one process ", worst);

  // The GradScaler's overflow finding is shared: one rank's inf skips the step on every rank.
  at::Tensor w = at::zeros({2}).set_requires_grad(true);
  auto plain = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  auto scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU), acc.comm(),
                                                    accel::GradScalerOptions{.init_scale = 8.0});
  accel::AcceleratedOptimizer<torch::optim::SGD> scaled(plain, scaler);
  for (int round = 0; round < 2; ++round) {
    const float g = round == 0 && tally.rank == N - 1 ? std::numeric_limits<float>::infinity() : 1.0f;
    scaler->scale(at::dot(w, at::full({2}, g))).backward();
    scaled.step();
    scaled.zero_grad();
    check(scaled.step_was_skipped() == (round == 0),
          "round " + std::to_string(round) + ": skipped on every rank iff a rank overflowed");
  }
  check(scaler->get_scale() == 4.0, "the scale backed off once, identically on every rank");
  check(w[0].item<float>() == -1.0f, "the finite round stepped with the unscaled gradient");

  // reduce as Accelerate: Accelerator::reduce sums by default, the module function averages; `scale` multiplies.
  const auto mine = F({float(tally.rank + 1)});
  const float sum = float(N * (N + 1) / 2);
  check(acc.reduce(mine).item<float>() == sum, "Accelerator::reduce sums by default (Accelerate's Accelerator.reduce)");
  check(accel::reduce(acc.comm(), mine).item<float>() == sum / float(N),
        "accel::reduce averages by default (Accelerate's reduce)");
  check(acc.reduce(mine, accel::Reduction::sum, 0.5).item<float>() == sum * 0.5f,
        "reduce(x, sum, scale) scales the sum");
  check(acc.reduce(mine, accel::Reduction::mean, 2.0).item<float>() == sum / float(N) * 2.0f,
        "reduce(x, mean, scale) scales the mean");
  check(acc.reduce(mine, accel::Reduction::max, 3.0).item<float>() == float(N) * 3.0f,
        "reduce(x, max, scale) scales the max");
}

namespace {

struct DispatchedSplit : accel::Accelerator<accel::dist::from_env, accel::loading::dispatched, accel::batches::split> {
};

// gather_for_metrics of objects over one epoch of a prepared loader of `n` samples: the same samples, in the same
// order, as the tensor form; every sample exactly once over the epoch, on every rank.
template <class Acc>
void gather_objects(Acc& acc, int64_t n, int64_t B, const std::string& what) {
  auto loader = acc.prepare(accel::data::DataLoader(
      accel::data::TensorDataset(at::randn({n, 2}), at::arange(n, at::kLong)), {.batch_size = B}));
  std::vector<std::string> seen;
  bool as_tensors = true, padded = false;
  for (const auto& b : loader) {
    const auto mine = sample_names(b.target);
    auto objects = acc.gather_for_metrics(mine);
    static_assert(std::is_same_v<decltype(objects), std::vector<std::string>>);
    as_tensors = as_tensors && objects == sample_names(acc.gather_for_metrics(b.target));
    padded = padded || int64_t(objects.size()) < int64_t(mine.size()) * acc.num_processes();
    seen.insert(seen.end(), objects.begin(), objects.end());
  }
  auto all = sample_names(at::arange(n, at::kLong));
  std::sort(seen.begin(), seen.end());
  std::sort(all.begin(), all.end());
  check(as_tensors, what + "gather_for_metrics of objects keeps the samples the tensor form keeps, in its order");
  check(padded, what + "the last batch had padding to drop");
  check(seen == all, what + "gather_for_metrics of objects: every sample exactly once (" + std::to_string(seen.size()) +
                         " of " + std::to_string(n) + ")");
  // Outside a loader: every rank's elements, concatenated in rank order (Accelerate's gather_object).
  std::vector<int64_t> mine(std::size_t(acc.process_index() + 1), acc.process_index());
  std::vector<int64_t> want;
  for (int q = 0; q < acc.num_processes(); ++q) want.insert(want.end(), std::size_t(q + 1), q);
  check(acc.gather_for_metrics(mine) == want, what + "outside a loader: every rank's elements in rank order");
}

}  // namespace

// The helpers around the loop: a trigger set on rank 1 only stops every rank at the same step; clip_grad_value_ on
// the averaged gradients equals a clamp; gather_for_metrics of objects drops the padding as the tensor form; the
// on_* helpers run on their process only.
void helpers(const Args&) {
  Trainer acc{accel::Options{.comm = options(30000).comm}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes(), me = acc.process_index();

  // set_trigger on rank 1 only, at step 3: every rank's check_trigger says so at that step, then the flag is reset.
  at::manual_seed(3);
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  auto [model, opt, loader] =
      acc.prepare(net, torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1)),
                  accel::data::DataLoader(accel::data::TensorDataset(at::randn({40 * N, 5}), at::randn({40 * N, 2})),
                                          {.batch_size = 4}));
  int64_t step = 0, stopped_at = -1;
  for (const auto& b : loader) {
    auto s = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    if (me == 1 && step == 3) acc.set_trigger();
    if (acc.check_trigger()) {
      stopped_at = step;
      break;
    }
    opt.step();
    opt.zero_grad();
    ++step;
  }
  const auto stops = accel::gather_object(acc.comm(), stopped_at);
  check(std::all_of(stops.begin(), stops.end(), [](int64_t s) { return s == 3; }),
        "a trigger set on rank 1 at step 3 stops every rank at step 3 (this rank: " + std::to_string(stopped_at) + ")");
  check(!acc.check_trigger(), "check_trigger reset the flag on every rank");
  if (me == N - 1) acc.set_trigger();
  check(acc.check_trigger(), "a trigger set on the last rank only is seen by every rank");

  // clip_grad_value_ after a backward: the averaged gradients, clamped.
  opt.zero_grad();
  {
    auto s = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(at::full({4, 5}, 3.0 + me)), at::full({4, 2}, -5.0)));
  }
  std::vector<at::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.grad().clone());
  const double limit = 0.5 * before[0].abs().max().item<double>();
  acc.clip_grad_value_(model, limit);
  bool clamped = true, changed = false;
  auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    clamped = clamped && at::equal(params[i].grad(), at::clamp(before[i], -limit, limit));
    changed = changed || !at::equal(params[i].grad(), before[i]);
  }
  check(clamped && changed, "clip_grad_value_ clamps every (averaged) gradient element to [-v, v]");

  // gather_for_metrics of objects: 10 samples in batches of 3 (per process: 3N per step) and a dispatched loader
  // splitting global batches of 4: the last batch is padded in both.
  at::manual_seed(5);
  gather_objects(acc, 10, 3, "per process: ");
  {
    DispatchedSplit dispatched;
    gather_objects(dispatched, 11, 2 * N, "dispatched, split: ");
  }

  // The on_* helpers: the callable runs on its process only; its result where it ran, nothing elsewhere.
  int ran = 0;
  const bool on_main = acc.on_main_process([&] { ++ran; });
  check(on_main == (me == 0), "on_main_process runs on rank 0 only");
  const std::optional<int> last = acc.on_last_process([&] {
    ++ran;
    return 10 * me;
  });
  check(last.has_value() == (me == N - 1) && (!last || *last == 10 * me),
        "on_last_process returns its result on the last rank only");
  const auto one = acc.on_process(1, [&] {
    ++ran;
    return std::string("one");
  });
  check(one.has_value() == (me == 1) && (!one || *one == "one"), "on_process(1) runs on rank 1 only");
  check(acc.on_local_main_process([&] { ++ran; }) == acc.is_local_main_process(),
        "on_local_main_process runs on the local main process");
  check(acc.on_local_process(N - 1, [&] { ++ran; }) == (acc.local_process_index() == N - 1),
        "on_local_process runs on its local index");
  const int want =
      (me == 0) + (me == N - 1) + (me == 1) + acc.is_local_main_process() + (acc.local_process_index() == N - 1);
  check(ran == want, "each helper ran its callable exactly where it said (" + std::to_string(ran) + " calls)");
  std::string error;
  try {
    (void)acc.on_process(N, [] {});
  } catch (const accel::InvalidArgument& e) {
    error = e.what();
  }
  check(error.find("process index " + std::to_string(N) + " is out of range") != std::string::npos &&
            error.find("0 to " + std::to_string(N - 1)) != std::string::npos,
        "on_process(N) is refused on every rank, naming the index and the range: " + error);
  acc.print("helpers on ", N, " processes: checked");
}

}  // namespace mp
