// One epoch of rank 0 of 2 processes over a tensor dataset (n = 1e6 samples of 16 floats + a label, batch 64,
// shuffled): accel's ShardedLoader versus (a) a hand-written loop doing the same index_select per batch and
// (b) LibTorch's own make_data_loader with DistributedRandomSampler and Stack. Same data, same binary.
// (The rank's work does not depend on the other process: loading is local; the ranks meet only to synchronise
// the sampler's generator once per epoch.)
#include "alloc_counter.hpp"

#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>

#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <benchmark/benchmark.h>
#include <torch/data.h>

namespace {

constexpr std::int64_t kSamples = 1'000'000, kBatch = 64, kFeatures = 16;
constexpr int kProcesses = 2, kRank = 0;

struct Data {
  at::Tensor x = at::randn({kSamples, kFeatures});
  at::Tensor y = at::randint(10, {kSamples}, at::kLong);
};
const Data& data() {
  static const Data d;
  return d;
}

struct Acc : accel::Accelerator<accel::dist::gloo, accel::place::none> {};

void BM_loader_epoch_accel(benchmark::State& state) {
  accel::data::DataLoader dl(accel::data::TensorDataset(data().x, data().y), {.batch_size = kBatch, .shuffle = true});
  auto loader =
      accel::data::prepare_data_loader<Acc::config>(dl, accel::data::PrepareContext{kProcesses, kRank, nullptr});
  std::int64_t batches = 0;
  for (auto _ : state)
    for (const auto& b : loader) {
      benchmark::DoNotOptimize(b.data.data_ptr());
      ++batches;
    }
  state.counters["batches"] = double(batches) / double(state.iterations());
}

// The same work by hand: this rank's batches of a shuffled epoch (every other batch of a permutation), each
// gathered with index_select.
void BM_loader_epoch_hand(benchmark::State& state) {
  const auto& d = data();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  std::int64_t batches = 0;
  for (auto _ : state) {
    const at::Tensor perm = at::randperm(kSamples, gen, at::TensorOptions().dtype(at::kLong));
    const std::int64_t count = (kSamples + kBatch - 1) / kBatch;
    for (std::int64_t j = kRank; j < count; j += kProcesses) {
      const at::Tensor idx = perm.narrow(0, j * kBatch, std::min(kBatch, kSamples - j * kBatch));
      auto x = at::index_select(d.x, 0, idx);
      auto y = at::index_select(d.y, 0, idx);
      benchmark::DoNotOptimize(x.data_ptr());
      benchmark::DoNotOptimize(y.data_ptr());
      ++batches;
    }
  }
  state.counters["batches"] = double(batches) / double(state.iterations());
}

// LibTorch's own loader: a map dataset, DistributedRandomSampler for rank 0 of 2, Stack<> collation.
struct TorchTensors : torch::data::datasets::Dataset<TorchTensors> {
  torch::data::Example<> get(size_t i) override { return {data().x[std::int64_t(i)], data().y[std::int64_t(i)]}; }
  torch::optional<size_t> size() const override { return size_t(kSamples); }
};
void BM_loader_epoch_libtorch(benchmark::State& state) {
  auto ds = TorchTensors{}.map(torch::data::transforms::Stack<>());
  torch::data::samplers::DistributedRandomSampler sampler(kSamples, kProcesses, kRank);
  auto loader =
      torch::data::make_data_loader(std::move(ds), std::move(sampler), torch::data::DataLoaderOptions(kBatch));
  std::int64_t batches = 0;
  for (auto _ : state)
    for (auto& b : *loader) {
      benchmark::DoNotOptimize(b.data.data_ptr());
      ++batches;
    }
  state.counters["batches"] = double(batches) / double(state.iterations());
}

}  // namespace

BENCHMARK(BM_loader_epoch_hand)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->Iterations(2);
BENCHMARK(BM_loader_epoch_accel)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->Iterations(2);
BENCHMARK(BM_loader_epoch_libtorch)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->Iterations(1);
BENCHMARK_MAIN();
