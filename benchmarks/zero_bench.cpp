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

#include <algorithm>
#include <cstdio>
#include <fstream>
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

constexpr std::int64_t kBatch = 32, kInputs = 1024, kHidden = 4096;
constexpr int kWarmup = 2, kSteps = 20;

torch::nn::Sequential make_mlp() {
  at::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(kInputs, kHidden), torch::nn::Tanh(),
                               torch::nn::Linear(kHidden, kInputs));
}

// One rank's figures for one Accelerator (doubles: they travel in one all-reduce; every value fits exactly).
struct Figures {
  double state_bytes = 0, gradient_bytes = 0, peak_bytes = 0, resident_bytes = 0, step_seconds = 0;
  double total_numel = 0, partition_numel = 0, padding_numel = 0;
  double backward_peak_bytes = 0, step_peak_bytes = 0;  // the peak's two halves: forward + backward, step + zero_grad
  static constexpr int kFields = 10;
  [[nodiscard]] std::vector<double> row() const {
    return {state_bytes, gradient_bytes,  peak_bytes,    resident_bytes,      step_seconds,
            total_numel, partition_numel, padding_numel, backward_peak_bytes, step_peak_bytes};
  }
  static Figures of(const double* r) { return {r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]}; }
};

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
Figures measure(Acc& acc) {
  settle(acc);
  const std::int64_t before = TensorCounter::live();
  Figures f;
  auto net = make_mlp();
  auto [model, opt] =
      acc.prepare(net, std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-4)));
  at::manual_seed(100 + acc.process_index());
  const at::Tensor x = at::randn({kBatch, kInputs}), y = at::randn({kBatch, kInputs});
  std::vector<double> times;
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    acc.wait_for_everyone();
    const auto t0 = Clock::now();
    {
      auto scope = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
    }
    if (s >= kWarmup) times.push_back(seconds_since(t0));
  }
  f.step_seconds = median(times);
  // One more step, untimed, for the memory figures: the peaks of forward + backward and of step + zero_grad.
  settle(acc);
  TensorCounter::reset_peak();
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
  f.peak_bytes = std::max(f.backward_peak_bytes, f.step_peak_bytes);
  settle(acc);
  f.resident_bytes = double(TensorCounter::live() - before);
  if (const auto& z = opt.sharded()) {
    f.state_bytes = double(z->state_bytes());
    f.total_numel = double(z->total_numel()), f.partition_numel = double(z->partition_numel()),
    f.padding_numel = double(z->padding_numel());
  } else {
    f.state_bytes = double(accel::optimizer_state_bytes(opt.inner()));
    for (const auto& p : net->parameters()) f.total_numel += double(p.numel());
    f.partition_numel = f.total_numel;
  }
  return f;
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
  const std::string out_path = argc > 1 ? argv[1] : "zero.json";
  // All three live for the whole run (as one rendezvous each); each measurement frees its model and optimizer.
  Ddp ddp;
  Zero1 zero1;
  Zero2 zero2;
  const int ranks = ddp.num_processes(), rank = ddp.process_index();
  if (ranks < 2) throw accel::InvalidArgument("zero_bench: run it under accel-launch --nproc-per-node 2");
  const char* modes[] = {"ddp", "zero1", "zero2"};
  std::vector<std::vector<Figures>> all;  // [mode][rank]
  all.push_back(per_rank(ddp.comm(), measure(ddp), rank, ranks));
  all.push_back(per_rank(ddp.comm(), measure(zero1), rank, ranks));
  all.push_back(per_rank(ddp.comm(), measure(zero2), rank, ranks));
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
    nlohmann::json entries = nlohmann::json::array();
    const double total = all[0][0].total_numel;
    for (std::size_t m = 1; m < all.size(); ++m) {
      const std::string stage = modes[m];
      const double partition = all[m][0].partition_numel, padding = all[m][0].padding_numel;
      // The goal of a partitioned figure: 1/N of DDP's plus the partition's padding, P / total.
      const double share = partition / total;
      auto bytes = [&](const std::string& what, double Figures::*field, std::optional<double> goal) {
        const double a = worst(m, field), b = worst(0, field);
        nlohmann::json e{{"name", stage + "_" + what},
                         {"unit", "bytes"},
                         {"accel_bytes", std::int64_t(a)},
                         {"baseline", baseline},
                         {"baseline_bytes", std::int64_t(b)},
                         {"ratio", a / b},
                         {"per_rank", bytes_of(ranks_of(m, field))},
                         {"baseline_per_rank", bytes_of(ranks_of(0, field))}};
        if (goal) e["goal"] = *goal;
        entries.push_back(std::move(e));
      };
      bytes("optimizer_state_bytes", &Figures::state_bytes, share * (1 + 1e-9));
      entries.back()["total_numel"] = std::int64_t(total), entries.back()["partition_numel"] = std::int64_t(partition);
      entries.back()["padding_numel"] = std::int64_t(padding);
      bytes("gradient_bytes", &Figures::gradient_bytes,
            m == 2 ? std::optional<double>(share * (1 + 1e-9)) : std::nullopt);
      bytes("step_peak_bytes", &Figures::peak_bytes, std::nullopt);
      entries.back()["backward_peak_per_rank"] = bytes_of(ranks_of(m, &Figures::backward_peak_bytes));
      entries.back()["optimizer_step_peak_per_rank"] = bytes_of(ranks_of(m, &Figures::step_peak_bytes));
      entries.back()["baseline_backward_peak_per_rank"] = bytes_of(ranks_of(0, &Figures::backward_peak_bytes));
      entries.back()["baseline_optimizer_step_peak_per_rank"] = bytes_of(ranks_of(0, &Figures::step_peak_bytes));
      bytes("resident_bytes", &Figures::resident_bytes, std::nullopt);
      const double a = worst(m, &Figures::step_seconds), b = worst(0, &Figures::step_seconds);
      entries.push_back({{"name", stage + "_train_step_2proc_cpu_adamw_mlp8M"},
                         {"accel_seconds", a},
                         {"baseline", baseline},
                         {"baseline_seconds", b},
                         {"ratio", a / b},
                         {"per_rank", ranks_of(m, &Figures::step_seconds)},
                         {"baseline_per_rank", ranks_of(0, &Figures::step_seconds)}});
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
