// Resuming at another number of processes on real processes (README, "Resuming at another world size"), the two
// halves of tests/distributed/resize.sh, which runs them with different --nproc-per-node on one checkpoint:
//
//   resize-loaders save DIR STOP    six loaders (sharded, split, dispatched, a batch sampler, a stream sharded and
//                                   dispatched) run epoch 0 and STOP steps of epoch 1; one checkpoint of all of
//                                   them in DIR/ckpt; what they consumed of epoch 1 (gather_for_metrics) in DIR
//   resize-loaders resume DIR       loads DIR/ckpt at this size: the rest of epoch 1 and what was consumed are every
//                                   sample once (in order, unshuffled), and epoch 2 is a fresh job's of this size
//   resize-training save DIR STOP   a model trained over epoch 0 and STOP steps of epoch 1, saved with save_state
//   resize-training resume DIR STOP resumed at this size to the end of epoch 2: the parameters equal one process
//                                   trained on the same global batches (computed here from the plans)
//   ... window                      with 2-step gradient accumulation (a checkpoint inside a window: resize.sh
//                                   expects the resume at another size to be refused)
//   ... zero                        under ZeRO stage 2: every saved partition of the momentum, re-cut at this size
#include "../../support/samples.hpp"
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/checkpoint/checkpointer.hpp>
#include <accel/data/loader.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <ranges>
#include <sstream>

namespace mp {
namespace {

namespace data = accel::data;
using Indices = data::RangeDataset<std::vector<std::int64_t>>;
using Sharded = accel::CheckedConfig<accel::dist::gloo>;
using Split = accel::CheckedConfig<accel::dist::gloo, accel::batches::split>;
using Dispatched = accel::CheckedConfig<accel::dist::gloo, accel::loading::dispatched>;

using accel_test::as_vector;
using accel_test::iota_vector;

// `steps` steps of the loader's current epoch (-1: the rest); returns the real samples of every step across the job
// (gather_for_metrics drops the padding) and this rank's batches as they came (padding included).
template <class Loader>
std::pair<std::vector<std::int64_t>, std::vector<std::vector<std::int64_t>>> take(Loader& l,
                                                                                  const accel::ProcessState& state,
                                                                                  std::int64_t steps) {
  std::vector<std::int64_t> real;
  std::vector<std::vector<std::int64_t>> mine;
  if (steps == 0) return {real, mine};
  std::int64_t j = 0;
  for (const auto& b : l) {
    mine.push_back(as_vector(b));
    const auto all = as_vector(accel::gather_for_metrics(state.comm(), b, accel::GradientState::instance().layout()));
    real.insert(real.end(), all.begin(), all.end());
    if (++j == steps) break;
  }
  return {real, mine};
}

std::string join(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  for (auto x : v) os << x << ' ';
  return os.str();
}
std::vector<std::int64_t> read_numbers(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::int64_t> v;
  for (std::int64_t x; in >> x;) v.push_back(x);
  return v;
}

struct Run {
  const accel::ProcessState& state;
  std::filesystem::path dir;
  bool save;
  std::int64_t stop;
  accel::checkpoint::Checkpointer ck;
  std::vector<std::function<void()>> after_load;  // each loader's checks once the checkpoint is loaded
  [[nodiscard]] accel::checkpoint::Checkpointer::Process process() const {
    return {state.process_index(), state.num_processes(), state.device(), [this] { state.wait_for_everyone(); }};
  }

  // One loader: `make()` prepares it as a fresh job does (after set_seed); `n` samples (user batches for a batch
  // sampler); `ordered`: its epoch consumes them as 0, 1, 2, ...; `fresh_next`: its epoch 2 is a fresh job's.
  template <class Make>
  void loader(const std::string& name, Make make, std::int64_t n, bool ordered, bool fresh_next) {
    auto l = make();
    ck.add_loader(
        {[l] { return l.state_dict(); },
         [l](const data::LoaderState& s) mutable { l.load_state_dict(s, data::GlobalGenerator::restored_by_caller); },
         [l](const data::LoaderState& s) { return l.state_mismatch(s); }});
    const auto file = dir / (name + ".consumed");
    if (save) {
      l.set_epoch(0);
      (void)take(l, state, -1);
      l.set_epoch(1);
      const auto real = take(l, state, stop).first;
      if (state.process_index() == 0) std::ofstream(file) << join(real);
      return;
    }
    after_load.push_back([=, this]() mutable {
      const auto s = l.state_dict();
      std::vector<std::int64_t> seen = read_numbers(file);
      check(l.epoch() == 1 || (l.epoch() == 2 && s.position == 0),
            name + ": resumes in epoch 1 (or at the start of 2)");
      if (l.epoch() == 1) {
        const auto rest = take(l, state, -1).first;
        seen.insert(seen.end(), rest.begin(), rest.end());
      }
      auto sorted = seen;
      std::sort(sorted.begin(), sorted.end());
      check(sorted == iota_vector(n),
            name + ": the interrupted epoch's samples over both runs are each seen exactly once (" +
                std::to_string(seen.size()) + " seen of " + std::to_string(n) + ")");
      if (ordered) check(seen == iota_vector(n), name + ": in the epoch's order");
      l.set_epoch(2);
      const auto next = take(l, state, -1).second;
      if (!fresh_next) return;
      auto reference = make();
      for (int e = 0; e < 2; ++e) {
        reference.set_epoch(e);
        (void)take(reference, state, -1);
      }
      reference.set_epoch(2);
      check(take(reference, state, -1).second == next,
            name + ": the next epoch is a fresh " + std::to_string(state.num_processes()) + "-process job's");
    });
  }
};

}  // namespace

void resize_loaders(const Args& args) {
  accel::ProcessState state(options(60000));
  tally.rank = state.process_index();
  const bool save = arg(args, 0, "") == "save";
  Run run{state, arg(args, 1, "."), save, std::stoll(arg(args, 2, "2")), {}, {}};
  const int N = state.num_processes();
  auto map = [](std::int64_t n, data::DataLoaderOptions o) { return data::DataLoader(Indices(iota_vector(n)), o); };
  static const auto items = iota_vector(29);
  auto seeded = [&](std::uint64_t seed, auto make) {
    return [=] {
      at::manual_seed(seed);
      return make();
    };
  };
  // Shuffled without a seed of its own: one process draws from the global generator, whose next epoch is not a
  // fresh job's (README).
  run.loader("sharded",
             seeded(42,
                    [&] {
                      return data::prepare_data_loader<Sharded>(
                          map(37, {.batch_size = 4, .shuffle = true, .workers = 1}), state);
                    }),
             37, false, N > 1);
  run.loader(
      "split",
      seeded(43, [&] { return data::prepare_data_loader<Split>(map(37, {.batch_size = 6, .shuffle = true}), state); }),
      37, false, N > 1);
  run.loader("dispatched",
             seeded(44,
                    [&] {
                      return data::prepare_data_loader<Dispatched>(
                          map(37, {.batch_size = 4, .shuffle = true, .seed = 5}), state);
                    }),
             37, false, true);
  run.loader("batch-sampler",
             seeded(45,
                    [&] {
                      return data::prepare_data_loader<Sharded>(
                          map(31, {.batch_sampler = accel_test::bucketed_batches}), state);
                    }),
             31, false, true);
  run.loader("iterable",
             seeded(46,
                    [&] {
                      return data::prepare_data_loader<Sharded>(
                          data::DataLoader(std::views::all(items), {.batch_size = 3}), state);
                    }),
             29, true, true);
  run.loader("iterable-dispatched",
             seeded(47,
                    [&] {
                      return data::prepare_data_loader<Dispatched>(
                          data::DataLoader(std::views::all(items), {.batch_size = 3}), state);
                    }),
             29, true, true);
  const auto ckpt = run.dir / "ckpt";
  if (save) {
    run.ck.save(ckpt, run.process(), 0, false);
    state.print("saved ", ckpt.string(), " with ", N, " process(es) after ", run.stop, " steps of epoch 1");
    return;
  }
  const auto meta = accel::checkpoint::describe(ckpt);
  run.ck.load(ckpt, run.process());
  for (auto& f : run.after_load) f();
  state.print("resumed ", meta.num_processes, " -> ", N, " process(es): 6 loaders");
}

// Training: a linear model, SGD with momentum, no shuffling; the reference is one process on the global batches of
// both runs (the padding of an even tail included, as the ranks train on it).
struct ResizeTrainer : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};
// The same under ZeRO stage 2: the partitions of the optimizer state are re-cut for the new number of processes.
struct ResizeZeroTrainer
    : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::shard::gradients> {};
// The same under full sharding: the model's shards and the optimizer's pieces are re-cut (one unit of 5 elements:
// 2 + 2 + 1 with 3 processes, 3 + 2 with 2, so pieces cross parameter boundaries).
struct ResizeFsdpTrainer
    : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::shard::parameters> {};

template <class Trainer>
void resize_training_with(const Args& args) {
  const bool window = arg(args, 3, "") == "window";
  Trainer acc{accel::Options{.seed = 3, .gradient_accumulation_steps = window ? 2 : 1, .comm = options(60000).comm}};
  tally.rank = acc.process_index();
  const bool save = arg(args, 0, "") == "save";
  const std::filesystem::path dir = arg(args, 1, ".");
  const std::int64_t stop = std::stoll(arg(args, 2, "3"));
  const std::int64_t n = 50, B = 2, epochs = 3;
  at::manual_seed(7);
  const at::Tensor x = at::randn({n, 4}), y = at::randn({n, 1});
  auto make = [] {
    at::manual_seed(11);
    return torch::nn::Linear(4, 1);
  };
  auto net = make();
  const auto initial = net->parameters();
  std::vector<at::Tensor> start;
  for (const auto& p : initial) start.push_back(p.detach().clone());
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt, loader] = acc.prepare(net, sgd, data::DataLoader(data::TensorDataset(x, y), {.batch_size = B}));
  const auto ckpt = dir / "train_ckpt";
  std::int64_t saved_processes = acc.num_processes();
  if (!save) {
    saved_processes = accel::checkpoint::describe(ckpt).num_processes;
    acc.load_state(ckpt);
  }
  std::int64_t steps = 0;
  for (std::int64_t e = loader.epoch(); e < epochs; ++e) {
    loader.set_epoch(e);
    for (const auto& b : loader) {
      auto guard = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(b.data), b.target));
      opt.step();
      opt.zero_grad();
      if (save && e == 1 && ++steps == stop) {
        acc.save_state(ckpt);
        acc.print("saved ", ckpt.string(), " with ", acc.num_processes(), " process(es) after ", stop,
                  " steps of epoch 1", acc.sync_gradients() ? "" : ", inside an accumulation window");
        return;
      }
    }
  }
  if (window) {  // the run of a checkpoint inside an accumulation window: it resumes (at the same size) and ends
    check(loader.epoch() == epochs, "trained to the end");
    return;
  }
  // The reference: one process, the same start, one step per global batch: epoch 0 and `stop` steps of epoch 1 as
  // the saving job cut them, the rest of epoch 1 and epoch 2 as this one does (each rank's batch, padding included;
  // equal batch sizes, so the mean of the ranks' means is the mean over the concatenation).
  auto reference = make();
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(start[i]);
  }
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto train_steps = [&](int P, std::int64_t from, std::int64_t count) {
    std::vector<accel::plan::BatchPlan> plans;
    for (int r = 0; r < P; ++r)
      plans.push_back(accel::plan::loader_plan({.batch_size = B, .num_processes = P, .process_index = r}, n,
                                               accel::plan::Loading::sharded, from));
    for (std::int64_t j = 0; j < std::min(count, plans[0].size()); ++j) {
      std::vector<std::int64_t> rows;
      for (const auto& p : plans)
        for (auto pos = p.span(j).begin; pos < p.span(j).end; ++pos) rows.push_back(p.sample(pos));
      const auto idx = at::tensor(rows, at::kLong);
      ref_opt.zero_grad();
      torch::mse_loss(reference->forward(x.index_select(0, idx)), y.index_select(0, idx)).backward();
      ref_opt.step();
    }
  };
  const int N = int(saved_processes), M = acc.num_processes();
  train_steps(N, 0, INT64_MAX);  // epoch 0
  train_steps(N, 0, stop);       // epoch 1, before the checkpoint
  const std::int64_t position = std::min(n, stop * B * N);
  train_steps(M, position, INT64_MAX);  // epoch 1, after it
  train_steps(M, 0, INT64_MAX);         // epoch 2
  double worst = 0;
  const auto full = acc.gather_parameters(model);  // full sharding: the whole model readable (nothing otherwise)
  auto a = net->parameters(), r = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const at::Tensor d = (a[i] - r[i]).abs().max();
    worst = std::max(worst, d.item<double>());
  }
  check(worst < 1e-6, "resumed " + std::to_string(N) + " -> " + std::to_string(M) +
                          " processes: the parameters of one process trained on the same global batches (max diff " +
                          std::to_string(worst) + ")");
  acc.print("training resumed ", N, " -> ", M, " processes: max parameter difference to one process ", worst);
}

void resize_training(const Args& args) {
  if (arg(args, 3, "") == "zero")
    resize_training_with<ResizeZeroTrainer>(args);
  else if (arg(args, 3, "") == "fsdp")
    resize_training_with<ResizeFsdpTrainer>(args);
  else
    resize_training_with<ResizeTrainer>(args);
}

}  // namespace mp
