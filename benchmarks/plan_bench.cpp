// Iterating a sharding plan versus a hand-written index loop that produces the same batches, side by side
// in one binary. n = 1e7 samples, batch 64, 8 processes (this process: rank 3), even tail (so the loop
// must pad like Accelerate). Both fill the same reusable index buffer per batch.
#include "alloc_counter.hpp"

#include <accel/data/sampler.hpp>
#include <accel/pipeline/plan_view.hpp>
#include <accel/plan/plan.hpp>

#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

namespace {

constexpr std::int64_t kSamples = 10'000'000, kDefaultBatch = 64;
constexpr int kProcesses = 8, kRank = 3;

// One 64-byte-aligned index buffer for both sides: with a fresh std::vector per run, its heap alignment
// alone moved either side's time by up to 2x between runs of the same binary.
struct AlignedBuffer {
  alignas(64) std::int64_t storage[4096];
  std::size_t n = 0;
  void resize(std::size_t k) { n = k; }
  [[nodiscard]] std::size_t size() const { return n; }
  std::int64_t* data() { return storage; }
  std::int64_t* begin() { return storage; }
  std::int64_t* end() { return storage + n; }
  std::int64_t& operator[](std::size_t i) { return storage[i]; }
};
AlignedBuffer& the_buffer() {
  static AlignedBuffer b;
  return b;
}

const accel::data::IndexOrder& shuffled() {
  static const auto order = [] {
    std::vector<std::int64_t> v(kSamples);
    std::iota(v.begin(), v.end(), 0);
    std::uint64_t x = 88172645463325252ull;  // xorshift Fisher-Yates: fixed, fast, torch-free
    for (std::int64_t i = kSamples - 1; i > 0; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(v[std::size_t(i)], v[std::size_t(x % std::uint64_t(i + 1))]);
    }
    return accel::data::IndexOrder::of(std::move(v));
  }();
  return order;
}

accel::plan::BatchPlan the_plan(std::int64_t batch) {
  return accel::plan::shard_plan({.batch_size = batch, .num_processes = kProcesses, .process_index = kRank}, kSamples);
}

void report(benchmark::State& state, std::int64_t batches, std::size_t bytes0) {
  const auto bytes = accel_bench::allocated_bytes.load() - bytes0;
  state.counters["batches"] = double(batches) / double(state.iterations());
  state.counters["bytes_per_batch"] = double(bytes) / double(batches);
  state.SetItemsProcessed(batches);
}

void accel_plan(benchmark::State& state, const accel::data::IndexOrder& order) {
  const auto view = accel::pipeline::planned_batches(the_plan(state.range(0)), order);
  auto& buf = the_buffer();
  std::int64_t batches = 0;
  const auto bytes0 = accel_bench::allocated_bytes.load();
  for (auto _ : state) {
    for (const auto& batch : view) {
      batch.indices_into(buf);
      benchmark::DoNotOptimize(buf.data());
      benchmark::ClobberMemory();
      ++batches;
    }
  }
  report(state, batches, bytes0);
}

// What a user would write by hand for BatchSamplerShard's even tail (the batch size is a run-time value,
// as it is for the library: it comes from the job's configuration): batch j of rank r is the user's batch
// j*N + r (a slice of the order, `perm` or the identity when null); positions past the end wrap onto the
// first round of batches.
void hand_loop(benchmark::State& state, const std::int64_t* perm) {
  const std::int64_t kBatch = state.range(0);
  const std::int64_t L = (kSamples + kBatch - 1) / kBatch;
  const std::int64_t count = (L + kProcesses - 1) / kProcesses;
  const std::int64_t wrap = std::min<std::int64_t>(kSamples, kProcesses * kBatch);
  auto at = [perm](std::int64_t i) { return perm ? perm[i] : i; };
  auto& buf = the_buffer();
  buf.resize(std::size_t(kBatch));
  std::int64_t batches = 0;
  const auto bytes0 = accel_bench::allocated_bytes.load();
  for (auto _ : state) {
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t start = (j * kProcesses + kRank) * kBatch;
      if (start + kBatch > kSamples) {  // the padded tail
        for (std::int64_t i = 0; i < kBatch; ++i) {
          const std::int64_t pos = start + i;
          buf[std::size_t(i)] = at(pos < kSamples ? pos : (pos - kSamples) % wrap);
        }
      } else if (perm) {
        std::copy(perm + start, perm + start + kBatch, buf.begin());
      } else {
        std::iota(buf.begin(), buf.end(), start);
      }
      benchmark::DoNotOptimize(buf.data());
      benchmark::ClobberMemory();
      ++batches;
    }
  }
  report(state, batches, bytes0);
}

void BM_plan_sequential_accel(benchmark::State& s) { accel_plan(s, accel::data::IndexOrder::sequential(kSamples)); }
void BM_plan_sequential_hand(benchmark::State& s) { hand_loop(s, nullptr); }
void BM_plan_shuffled_accel(benchmark::State& s) { accel_plan(s, shuffled()); }
void BM_plan_shuffled_hand(benchmark::State& s) { hand_loop(s, shuffled().data()); }  // the same memory as accel

}  // namespace

// Interleaved registration so both sides of a pair see the same machine state.
BENCHMARK(BM_plan_sequential_hand)
    ->Arg(kDefaultBatch)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_plan_sequential_accel)
    ->Arg(kDefaultBatch)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_plan_shuffled_hand)
    ->Arg(kDefaultBatch)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_plan_shuffled_accel)
    ->Arg(kDefaultBatch)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_MAIN();
