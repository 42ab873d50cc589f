// ZeRO sharding side by side, 2 CPU processes on loopback (run under accel-launch; scripts/bench sets
// OMP_NUM_THREADS=1): the same AdamW training of an MLP 1024-4096-1024 (8.4 M parameters, batch 32 per process)
// through three Accelerators in one run,
//   DDP      accel::Accelerator<dist::from_env>                        every rank holds all state and gradients
//   stage 1  accel::Accelerator<dist::from_env, shard::optimizer>      1/N of the optimizer state per rank
//   stage 2  accel::Accelerator<dist::from_env, shard::gradients>      1/N of the gradients as well
// and, per rank: the optimizer state's bytes; the gradient bytes held after a synchronising backward (the distinct
// storages behind every parameter's gradient and the partition's); the peak tensor bytes allocated during one
// training step (forward, backward, step, zero_grad) and those still allocated after it, both above what the rank
// held before it built the model (every CPU tensor allocation of the process counted by alloc_counter.hpp); and the
// median step time over 20 steps after 2 warm-up steps (wait_for_everyone before each).
// Rank 0 writes entries of build/bench/results.json to argv[1]: stage 1 and 2 against DDP, ratio = sharded / DDP
// (bytes entries carry "unit": "bytes", "accel_bytes" and "baseline_bytes" instead of seconds).
//
// `--model linear52M` (2 or 4 processes): 8 x Linear(2560, 2560) with ReLU between (52,480,000 parameters, 210 MB in
// fp32; batch 8 per process, 2 warm-up and 10 timed steps) through the three above and a fourth,
//   full     accel::Accelerator<dist::from_env, shard::parameters>     1/N of each Linear (a unit each) per rank
// with, per rank, the parameter bytes held (full sharding: the shards, and the most bytes of full parameters gathered
// at once during a step, `UnitSharder::peak_gathered_bytes`), the peak resident set of a step above the one before
// the model was built (VmHWM after a reset, for comparison with benchmarks/python_fsdp.py) and the goal: shards + peak
// gathered <= model / N + the two largest units. Its entries carry the suffix _<N>proc_cpu_adamw_linear52M; rank 0 also
// prints a table. Full sharding prefetches the next unit's all-gather, forward and backward (Note [Prefetching the
// next unit] in model/unit_sharder.hpp); `--no-prefetch` turns that off, to measure what it brings.
//
// `--model linear52M --paired R`: step time only, paired: DDP and full sharding with and without prefetching are
// prepared side by side and step in turn (one step of each, the order rotating), 2 warm-up and R timed rounds; a
// step's time (and each of its forward, backward and optimizer step) is the slowest rank's. On a machine shared with
// other jobs the load moves between two runs a minute apart, not between three steps a few seconds apart, so each
// round's ratios (full / DDP, prefetching / not) weigh the load alike on both sides; their medians are the entries
// (suffix _paired), which also give the time of one unit's pieces: the all-gather of its shards and its forward GEMM.
#include "alloc_counter.hpp"
#include "mlp.hpp"

#include <accel/accel.hpp>

#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {
using namespace bench;
using accel_bench::TensorCounter;

struct Ddp : accel::Accelerator<accel::dist::from_env> {};
struct Zero1 : accel::Accelerator<accel::dist::from_env, accel::shard::optimizer> {};
struct Zero2 : accel::Accelerator<accel::dist::from_env, accel::shard::gradients> {};
struct Full : accel::Accelerator<accel::dist::from_env, accel::shard::parameters> {};

// The model and how it is trained: `mlp8M` (the default, DDP and stages 1 and 2) or `linear52M` (all four modes).
struct Workload {
  std::string name;
  std::int64_t batch, inputs;
  int warmup, steps;
  std::function<torch::nn::Sequential()> make;
  bool full;  // with full sharding (each Linear a unit)
};

Workload workload(const std::string& name) {
  if (name == "mlp8M")
    return {name,
            32,
            1024,
            2,
            20,
            [] {
              at::manual_seed(3);
              return torch::nn::Sequential(torch::nn::Linear(1024, 4096), torch::nn::Tanh(),
                                           torch::nn::Linear(4096, 1024));
            },
            false};
  if (name == "linear52M")
    return {name,
            8,
            2560,
            2,
            10,
            [] {
              at::manual_seed(3);
              torch::nn::Sequential net;
              for (int l = 0; l < 8; ++l) {
                net->push_back(torch::nn::Linear(2560, 2560));
                if (l < 7) net->push_back(torch::nn::ReLU());
              }
              return net;
            },
            true};
  throw accel::InvalidArgument("zero_bench: --model is mlp8M or linear52M, not '" + name + "'");
}

// The process's resident set: VmHWM (the peak) after `reset_rss_peak`, and VmRSS now, in bytes (Linux /proc).
double proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return 1024.0 * std::stod(line.substr(std::strlen(key)));
  return 0;
}
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
// The resident set follows the live tensors only if freed blocks go back to the system: before reading it, the heap's
// free pages are returned (malloc_trim) and, for the measured step, every block of 1 MiB or more is mmapped (unmapped
// when freed; glibc's dynamic threshold would have put 26 MB weights on the heap after the first was freed). After
// it, 32 MiB (where the dynamic threshold ends up) for the next mode's timed steps. python_fsdp.py does the same.
void rss_follows_tensors(bool on) {
  if (on) malloc_trim(0);
  mallopt(M_MMAP_THRESHOLD, on ? 1 << 20 : 32 << 20);
}

// One rank's figures for one Accelerator (doubles: they travel in one all-reduce; every value fits exactly).
struct Figures {
  double state_bytes = 0, gradient_bytes = 0, peak_bytes = 0, resident_bytes = 0, step_seconds = 0;
  double total_numel = 0, partition_numel = 0, padding_numel = 0;
  double backward_peak_bytes = 0, step_peak_bytes = 0;  // the peak's two halves: forward + backward, step + zero_grad
  // Parameters held between steps (full sharding: the shards), the most full parameters gathered at once during a
  // step (full sharding), the two largest units' full bytes (the goal's allowance), the peak resident set of a step
  // above the resident set before the model was built, and that.
  double parameter_bytes = 0, peak_gathered_bytes = 0, two_largest_unit_bytes = 0, peak_rss_bytes = 0,
         rss_before_bytes = 0, step_min_seconds = 0, step_max_seconds = 0;
  static constexpr int kFields = 17;
  [[nodiscard]] std::vector<double> row() const {
    return {state_bytes,
            gradient_bytes,
            peak_bytes,
            resident_bytes,
            step_seconds,
            total_numel,
            partition_numel,
            padding_numel,
            backward_peak_bytes,
            step_peak_bytes,
            parameter_bytes,
            peak_gathered_bytes,
            two_largest_unit_bytes,
            peak_rss_bytes,
            rss_before_bytes,
            step_min_seconds,
            step_max_seconds};
  }
  static Figures of(const double* r) {
    return {r[0], r[1],  r[2],  r[3],  r[4],  r[5],  r[6],  r[7], r[8],
            r[9], r[10], r[11], r[12], r[13], r[14], r[15], r[16]};
  }
};

// Bytes of the distinct storages behind `tensors` (parameters that alias one flat buffer count it once).
std::int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_map<const void*, std::int64_t> storages;
  for (const auto& t : tensors) storages.emplace(t.storage().data(), std::int64_t(t.storage().nbytes()));
  std::int64_t n = 0;
  for (const auto& [ptr, bytes] : storages) n += bytes;
  return n;
}

// Bytes of the distinct storages behind the gradients of `params` (a DDP gradient is an alias of its bucket, whose
// whole storage is counted once; a stage 2 partition's gradient is one storage).
std::int64_t gradient_storage_bytes(const std::vector<at::Tensor>& params) {
  std::unordered_map<const void*, std::int64_t> storages;
  for (const auto& p : params)
    if (p.grad().defined()) storages.emplace(p.grad().storage().data(), std::int64_t(p.grad().storage().nbytes()));
  std::int64_t n = 0;
  for (const auto& [ptr, bytes] : storages) n += bytes;
  return n;
}

// Lets the previous collectives' buffers go, then lines the ranks up. Gloo's worker thread drops its reference to
// a finished collective's tensors (the all-gather's copy of the partition) a moment after wait() returns, so
// memory read right after a step is sometimes one partition high.
template <class Acc>
void settle(Acc& acc) {
  acc.wait_for_everyone();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  acc.wait_for_everyone();
}

template <class Acc>
Figures measure(Acc& acc, const Workload& w) {
  settle(acc);
  const std::int64_t before = TensorCounter::live();
  Figures f;
  malloc_trim(0);
  f.rss_before_bytes = proc_status_bytes("VmRSS:");
  auto net = w.make();
  auto [model, opt] =
      acc.prepare(net, std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-4)));
  std::shared_ptr<accel::UnitSharder> sharder;
  if constexpr (std::is_same_v<Acc, Full>) sharder = model.distributed().sharder();
  at::manual_seed(100 + acc.process_index());
  const at::Tensor x = at::randn({w.batch, w.inputs}), y = at::randn({w.batch, w.inputs});
  std::vector<double> times;
  if (sharder) sharder->reset_peak();
  for (int s = 0; s < w.warmup + w.steps; ++s) {
    acc.wait_for_everyone();
    const auto t0 = Clock::now();
    {
      auto scope = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
    }
    if (s >= w.warmup) times.push_back(seconds_since(t0));
  }
  f.step_seconds = median(times);
  f.step_min_seconds = *std::min_element(times.begin(), times.end());
  f.step_max_seconds = *std::max_element(times.begin(), times.end());
  if (sharder) f.peak_gathered_bytes = double(sharder->peak_gathered_bytes());
  // One more step, untimed, for the memory figures: the peaks of forward + backward and of step + zero_grad.
  settle(acc);
  rss_follows_tensors(true);
  TensorCounter::reset_peak();
  reset_rss_peak();
  {
    auto scope = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    f.backward_peak_bytes = double(TensorCounter::peak() - before);
    std::vector<at::Tensor> holders = net->parameters();
    if (const auto& z = opt.sharded())
      for (const auto& g : z->inner().param_groups())
        for (const auto& p : g.params()) holders.push_back(p);
    f.gradient_bytes = double(gradient_storage_bytes(holders));
    TensorCounter::reset_peak();
    opt.step();
    opt.zero_grad();
    f.step_peak_bytes = double(TensorCounter::peak() - before);
  }
  f.peak_rss_bytes = proc_status_bytes("VmHWM:") - f.rss_before_bytes;
  rss_follows_tensors(false);
  if (sharder) f.peak_gathered_bytes = std::max(f.peak_gathered_bytes, double(sharder->peak_gathered_bytes()));
  f.peak_bytes = std::max(f.backward_peak_bytes, f.step_peak_bytes);
  settle(acc);
  f.resident_bytes = double(TensorCounter::live() - before);
  if (sharder) {
    // Each unit's shard (P elements) and full size (N x P); the goal allows the two largest gathered at once.
    std::vector<double> full;
    std::vector<at::Tensor> shards;
    for (const auto& u : sharder->units()) {
      if (!u.shard.defined()) continue;
      shards.push_back(u.shard);
      full.push_back(double(u.part) * acc.num_processes() * double(u.shard.element_size()));
      f.total_numel += double(u.total), f.partition_numel += double(u.part);
    }
    f.parameter_bytes = double(storage_bytes(shards));
    std::sort(full.rbegin(), full.rend());
    for (std::size_t k = 0; k < full.size() && k < 2; ++k) f.two_largest_unit_bytes += full[k];
    f.padding_numel = f.partition_numel * acc.num_processes() - f.total_numel;
    f.state_bytes = double(opt.sharded()->state_bytes());
  } else if (const auto& z = opt.sharded()) {
    f.parameter_bytes = double(storage_bytes(net->parameters()));
    f.state_bytes = double(z->state_bytes());
    f.total_numel = double(z->total_numel()), f.partition_numel = double(z->partition_numel()),
    f.padding_numel = double(z->padding_numel());
  } else {
    f.parameter_bytes = double(storage_bytes(net->parameters()));
    f.state_bytes = double(accel::optimizer_state_bytes(opt.inner()));
    for (const auto& p : net->parameters()) f.total_numel += double(p.numel());
    f.partition_numel = f.total_numel;
  }
  return f;
}

// A training step of a model that `acc` prepares (as `measure` trains it), timed after a barrier: the forward (with
// the loss), the backward, the optimizer's step with zero_grad, in ms.
template <class Acc>
std::function<std::array<double, 3>()> timed_step(Acc& acc, const Workload& w, const at::Tensor& x,
                                                  const at::Tensor& y) {
  auto net = w.make();
  auto raw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-4));
  using Prepared = decltype(acc.prepare(net, raw));
  auto prepared = std::make_shared<Prepared>(acc.prepare(net, raw));
  return [&acc, prepared, x, y] {
    auto& [model, opt] = *prepared;
    acc.wait_for_everyone();
    std::array<double, 3> ms{};
    auto t0 = Clock::now();
    auto scope = acc.accumulate(model);
    const at::Tensor loss = torch::mse_loss(model(x), y);
    ms[0] = 1e3 * seconds_since(t0);
    t0 = Clock::now();
    acc.backward(loss);
    ms[1] = 1e3 * seconds_since(t0);
    t0 = Clock::now();
    opt.step();
    opt.zero_grad();
    ms[2] = 1e3 * seconds_since(t0);
    return ms;
  };
}

// `--paired R` (see the file's description): writes its entries to `out_path` (rank 0).
void paired(const Workload& w, int rounds, const std::string& out_path) {
  Ddp ddp;
  std::vector<std::string> units;
  for (int l = 0; l < 8; ++l) units.push_back(std::to_string(2 * l));  // each Linear
  Full on{accel::Options{.sharding = {.units = units}}};
  Full off{accel::Options{.sharding = {.units = units, .forward_prefetch = false, .backward_prefetch = false}}};
  const int ranks = ddp.num_processes(), rank = ddp.process_index();
  at::manual_seed(100 + rank);
  const at::Tensor x = at::randn({w.batch, w.inputs}), y = at::randn({w.batch, w.inputs});
  // The pieces a unit's forward is made of: the all-gather of its shards (what a prefetch overlaps) and its GEMM.
  std::vector<double> gather_ms, gemm_ms;
  {
    const at::Tensor part = at::randn({(w.inputs * w.inputs + w.inputs + ranks - 1) / ranks}),
                     weight = at::randn({w.inputs, w.inputs});
    at::Tensor whole = at::empty({part.numel() * ranks});
    for (int k = 0; k < 2 + rounds; ++k) {
      ddp.wait_for_everyone();
      auto t0 = Clock::now();
      ddp.comm()->all_gather_into(whole, part);
      const double g = 1e3 * seconds_since(t0);
      t0 = Clock::now();
      (void)at::mm(x, weight.t());
      if (k >= 2) gather_ms.push_back(g), gemm_ms.push_back(1e3 * seconds_since(t0));
    }
  }
  const char* names[] = {"DDP", "full, prefetching", "full, not prefetching"};
  std::vector<std::function<std::array<double, 3>()>> steps{timed_step(ddp, w, x, y), timed_step(on, w, x, y),
                                                            timed_step(off, w, x, y)};
  at::Tensor t = at::zeros({3, 4, rounds}, at::kDouble);  // mode, (step, forward, backward, optimizer), round
  for (int r = -w.warmup; r < rounds; ++r)
    for (int k = 0; k < 3; ++k) {
      const int m = (k + std::max(r, 0)) % 3;
      const auto ms = steps[std::size_t(m)]();
      if (r < 0) continue;
      t[m][0][r] = ms[0] + ms[1] + ms[2];
      for (int p = 0; p < 3; ++p) t[m][p + 1][r] = ms[std::size_t(p)];
    }
  ddp.comm()->all_reduce(t, accel::comm::ReduceOp::max);  // a step takes as long as its slowest rank
  if (rank != 0) return ddp.wait_for_everyone();
  auto row = [&](int m, int p) {
    const at::Tensor c = t[m][p].contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + rounds);
  };
  auto ratios = [&](int a, int b) {
    std::vector<double> v;
    for (int r = 0; r < rounds; ++r) v.push_back(t[a][0][r].item<double>() / t[b][0][r].item<double>());
    return v;
  };
  const std::string tag = "_" + std::to_string(ranks) + "proc_cpu_adamw_" + w.name + "_paired";
  nlohmann::json entries = nlohmann::json::array();
  auto entry = [&](const std::string& name, int a, int b, const std::string& baseline) {
    const auto rs = ratios(a, b);
    auto secs = [](std::vector<double> v) {
      for (auto& e : v) e /= 1e3;
      return v;
    };
    nlohmann::json e{{"name", name + tag},
                     {"accel_seconds", median(row(a, 0)) / 1e3},
                     {"baseline", baseline},
                     {"baseline_seconds", median(row(b, 0)) / 1e3},
                     {"ratio", median(rs)},
                     {"round_ratios", rs},
                     {"rounds", rounds},
                     {"accel_round_seconds", secs(row(a, 0))},
                     {"baseline_round_seconds", secs(row(b, 0))},
                     {"accel_forward_backward_optimizer_seconds",
                      {median(row(a, 1)) / 1e3, median(row(a, 2)) / 1e3, median(row(a, 3)) / 1e3}},
                     {"baseline_forward_backward_optimizer_seconds",
                      {median(row(b, 1)) / 1e3, median(row(b, 2)) / 1e3, median(row(b, 3)) / 1e3}},
                     {"unit_all_gather_seconds", median(gather_ms) / 1e3},
                     {"unit_forward_gemm_seconds", median(gemm_ms) / 1e3}};
    if (b == 0 && ranks == 2) e["goal"] = 1.3;  // the issue's: within 1.3x of DDP on 2 CPU processes
    entries.push_back(std::move(e));
  };
  entry("full_train_step", 1, 0, "accel DDP (unsharded)");
  entry("full_noprefetch_train_step", 2, 0, "accel DDP (unsharded)");
  entry("full_prefetch_vs_noprefetch_train_step", 1, 2, "accel full sharding, not prefetching");
  std::printf("%d processes, %d rounds of one step each (medians, ms; a step: the slowest rank's)\n", ranks, rounds);
  std::printf("  one unit: all-gather of its shards %.1f, its forward GEMM %.1f (rank 0)\n", median(gather_ms),
              median(gemm_ms));
  std::printf("  %-24s %8s %8s %8s %10s\n", "", "step", "forward", "backward", "optimizer");
  for (int m = 0; m < 3; ++m)
    std::printf("  %-24s %8.1f %8.1f %8.1f %10.1f\n", names[m], median(row(m, 0)), median(row(m, 1)), median(row(m, 2)),
                median(row(m, 3)));
  for (const auto& e : entries)
    std::printf("  %-60s median of the rounds' ratios %.3f\n", e["name"].get<std::string>().c_str(),
                e["ratio"].get<double>());
  std::ofstream(out_path) << entries.dump(2);
  ddp.wait_for_everyone();
}

// Every rank's figures, on every rank (row r: rank r).
std::vector<Figures> per_rank(accel::comm::Communicator* comm, const Figures& mine, int rank, int ranks) {
  at::Tensor t = at::zeros({ranks, Figures::kFields}, at::kDouble);
  const auto row = mine.row();
  for (int k = 0; k < Figures::kFields; ++k) t[rank][k] = row[std::size_t(k)];
  comm->all_reduce(t);
  std::vector<Figures> out;
  for (int r = 0; r < ranks; ++r) out.push_back(Figures::of(t[r].contiguous().data_ptr<double>()));
  return out;
}
}  // namespace

int main(int argc, char** argv) try {
  accel_bench::count_tensor_bytes();
  std::string out_path = "zero.json", model_name = "mlp8M";
  bool prefetch = true;
  int rounds = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--model" && a + 1 < argc)
      model_name = argv[++a];
    else if (arg == "--no-prefetch")
      prefetch = false;
    else if (arg == "--paired" && a + 1 < argc)
      rounds = std::stoi(argv[++a]);
    else
      out_path = arg;
  }
  const Workload w = workload(model_name);
  if (rounds > 0) {
    if (!w.full) throw accel::InvalidArgument("zero_bench: --paired needs --model linear52M");
    paired(w, rounds, out_path);
    return 0;
  }
  // All of them live for the whole run (as one rendezvous each); each measurement frees its model and optimizer.
  Ddp ddp;
  Zero1 zero1;
  Zero2 zero2;
  std::optional<Full> full;
  if (w.full) {
    std::vector<std::string> units;
    for (int l = 0; l < 8; ++l) units.push_back(std::to_string(2 * l));  // each Linear
    full.emplace(
        accel::Options{.sharding = {.units = units, .forward_prefetch = prefetch, .backward_prefetch = prefetch}});
  }
  const int ranks = ddp.num_processes(), rank = ddp.process_index();
  if (ranks < 2) throw accel::InvalidArgument("zero_bench: run it under accel-launch --nproc-per-node 2");
  const char* modes[] = {"ddp", "zero1", "zero2", "full"};
  std::vector<std::vector<Figures>> all;  // [mode][rank]
  all.push_back(per_rank(ddp.comm(), measure(ddp, w), rank, ranks));
  all.push_back(per_rank(ddp.comm(), measure(zero1, w), rank, ranks));
  all.push_back(per_rank(ddp.comm(), measure(zero2, w), rank, ranks));
  if (full) all.push_back(per_rank(ddp.comm(), measure(*full, w), rank, ranks));
  if (rank == 0) {
    for (std::size_t m = 0; m < all.size(); ++m)
      for (int r = 0; r < ranks; ++r) {
        const auto& f = all[m][std::size_t(r)];
        std::printf(
            "rank %d %-5s state %9.0f B  gradients held %9.0f B  peak %9.0f B (backward %9.0f, step %9.0f)  resident "
            "%9.0f B  "
            "step %.2f ms\n",
            r, modes[m], f.state_bytes, f.gradient_bytes, f.peak_bytes, f.backward_peak_bytes, f.step_peak_bytes,
            f.resident_bytes, 1e3 * f.step_seconds);
      }
    // An entry's figure is the largest over the ranks (what each rank must provide); per_rank lists them all.
    auto worst = [&](std::size_t m, double Figures::*field) {
      double v = 0;
      for (const auto& f : all[m]) v = std::max(v, f.*field);
      return v;
    };
    auto ranks_of = [&](std::size_t m, double Figures::*field) {
      std::vector<double> v;
      for (const auto& f : all[m]) v.push_back(f.*field);
      return v;
    };
    auto bytes_of = [](const std::vector<double>& v) { return std::vector<std::int64_t>(v.begin(), v.end()); };
    const std::string baseline = "accel DDP (unsharded)";
    // The default run keeps its names; the linear52M run names the processes and the model in each entry.
    const std::string tag = w.full ? "_" + std::to_string(ranks) + "proc_cpu_adamw_" + w.name : "";
    nlohmann::json entries = nlohmann::json::array();
    const double total = all[0][0].total_numel;
    for (std::size_t m = 1; m < all.size(); ++m) {
      const std::string stage = modes[m];
      const double partition = all[m][0].partition_numel, padding = all[m][0].padding_numel;
      // The goal of a partitioned figure: 1/N of DDP's plus the partition's padding, P / total.
      const double share = partition / total;
      auto bytes = [&](const std::string& what, double Figures::*field, std::optional<double> goal) {
        const double a = worst(m, field), b = worst(0, field);
        nlohmann::json e{
            {"name", stage + "_" + what + tag},         {"unit", "bytes"},
            {"accel_bytes", std::int64_t(a)},           {"baseline", baseline},
            {"baseline_bytes", std::int64_t(b)},        {"ratio", a / b},
            {"per_rank", bytes_of(ranks_of(m, field))}, {"baseline_per_rank", bytes_of(ranks_of(0, field))}};
        if (goal) e["goal"] = *goal;
        entries.push_back(std::move(e));
      };
      bytes("optimizer_state_bytes", &Figures::state_bytes, share * (1 + 1e-9));
      entries.back()["total_numel"] = std::int64_t(total), entries.back()["partition_numel"] = std::int64_t(partition);
      entries.back()["padding_numel"] = std::int64_t(padding);
      bytes("gradient_bytes", &Figures::gradient_bytes,
            m >= 2 ? std::optional<double>(share * (1 + 1e-9)) : std::nullopt);
      bytes("step_peak_bytes", &Figures::peak_bytes, std::nullopt);
      entries.back()["backward_peak_per_rank"] = bytes_of(ranks_of(m, &Figures::backward_peak_bytes));
      entries.back()["optimizer_step_peak_per_rank"] = bytes_of(ranks_of(m, &Figures::step_peak_bytes));
      entries.back()["baseline_backward_peak_per_rank"] = bytes_of(ranks_of(0, &Figures::backward_peak_bytes));
      entries.back()["baseline_optimizer_step_peak_per_rank"] = bytes_of(ranks_of(0, &Figures::step_peak_bytes));
      bytes("resident_bytes", &Figures::resident_bytes, std::nullopt);
      if (w.full) {
        bytes("parameter_bytes", &Figures::parameter_bytes,
              m == 3 ? std::optional<double>(share * (1 + 1e-9)) : std::nullopt);
        bytes("peak_rss_bytes", &Figures::peak_rss_bytes, std::nullopt);
        entries.back()["rss_before_per_rank"] = bytes_of(ranks_of(m, &Figures::rss_before_bytes));
        entries.back()["baseline_rss_before_per_rank"] = bytes_of(ranks_of(0, &Figures::rss_before_bytes));
      }
      if (m == 3) {
        // The goal: shards + the most gathered at once <= model / N + the two largest units (gathered + prefetched).
        std::vector<double> held;
        for (const auto& f : all[m]) held.push_back(f.parameter_bytes + f.peak_gathered_bytes);
        const double a = *std::max_element(held.begin(), held.end()), b = worst(0, &Figures::parameter_bytes);
        const double allowance = b / ranks + worst(m, &Figures::two_largest_unit_bytes);
        entries.push_back({{"name", "full_peak_parameter_bytes" + tag},
                           {"unit", "bytes"},
                           {"accel_bytes", std::int64_t(a)},
                           {"baseline", baseline},
                           {"baseline_bytes", std::int64_t(b)},
                           {"ratio", a / b},
                           {"goal", allowance / b},
                           {"goal_bytes", std::int64_t(allowance)},
                           {"goal_met", a <= allowance},
                           {"per_rank", bytes_of(held)},
                           {"peak_gathered_per_rank", bytes_of(ranks_of(m, &Figures::peak_gathered_bytes))},
                           {"shard_per_rank", bytes_of(ranks_of(m, &Figures::parameter_bytes))},
                           {"two_largest_units_bytes", std::int64_t(worst(m, &Figures::two_largest_unit_bytes))}});
        std::printf(
            "goal: parameter bytes per rank (shards %.1f MB + peak gathered %.1f MB) = %.1f MB <= model/N "
            "%.1f MB + two largest units %.1f MB = %.1f MB: %s (%.3f of the allowance)\n",
            1e-6 * worst(m, &Figures::parameter_bytes), 1e-6 * worst(m, &Figures::peak_gathered_bytes), 1e-6 * a,
            1e-6 * b / ranks, 1e-6 * worst(m, &Figures::two_largest_unit_bytes), 1e-6 * allowance,
            a <= allowance ? "met" : "NOT met", a / allowance);
      }
      const double a = worst(m, &Figures::step_seconds), b = worst(0, &Figures::step_seconds);
      nlohmann::json e{{"name", stage + (w.full ? "_train_step" + tag : "_train_step_2proc_cpu_adamw_mlp8M")},
                       {"accel_seconds", a},
                       {"baseline", baseline},
                       {"baseline_seconds", b},
                       {"ratio", a / b},
                       {"per_rank", ranks_of(m, &Figures::step_seconds)},
                       {"baseline_per_rank", ranks_of(0, &Figures::step_seconds)}};
      if (w.full) {
        e["steps"] = w.steps,
        e["range_seconds"] = {worst(m, &Figures::step_min_seconds), worst(m, &Figures::step_max_seconds)};
        e["baseline_range_seconds"] = {worst(0, &Figures::step_min_seconds), worst(0, &Figures::step_max_seconds)};
        if (m == 3 && ranks == 2) e["goal"] = 1.3;  // the issue's: within 1.3x of DDP on 2 CPU processes
        if (m == 3) e["prefetch"] = prefetch;
      }
      entries.push_back(std::move(e));
    }
    if (w.full) {
      std::printf("\n%-34s %14s %14s %14s %14s\n", ("per rank, " + std::to_string(ranks) + " processes").c_str(), "DDP",
                  "ZeRO-1", "ZeRO-2", "full");
      auto row = [&](const char* what, double Figures::*field, double scale, const char* unit) {
        std::printf("%-34s", what);
        for (std::size_t m = 0; m < all.size(); ++m) std::printf(" %11.1f %s", scale * worst(m, field), unit);
        std::printf("\n");
      };
      row("parameters held", &Figures::parameter_bytes, 1e-6, "MB");
      row("  + most gathered at once", &Figures::peak_gathered_bytes, 1e-6, "MB");
      row("gradients after a sync backward", &Figures::gradient_bytes, 1e-6, "MB");
      row("optimizer state", &Figures::state_bytes, 1e-6, "MB");
      row("peak tensor bytes of a step", &Figures::peak_bytes, 1e-6, "MB");
      row("resident after the step", &Figures::resident_bytes, 1e-6, "MB");
      row("peak RSS of a step - RSS before", &Figures::peak_rss_bytes, 1e-6, "MB");
      row("step time (median)", &Figures::step_seconds, 1e3, "ms");
      std::printf("full sharding %s the next unit's all-gather\n", prefetch ? "prefetches" : "does not prefetch");
    }
    std::ofstream(out_path) << entries.dump(2);
    for (const auto& e : entries)
      std::cout << e["name"].get<std::string>() << ": ratio " << e["ratio"].get<double>() << " against " << baseline
                << std::endl;
  }
  ddp.wait_for_everyone();
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
