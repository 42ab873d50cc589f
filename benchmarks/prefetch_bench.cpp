// Prefetching against the ideal, 2 CPU processes on loopback (run under accel-launch; scripts/bench sets
// OMP_NUM_THREADS=1): a dataset whose every sample waits `kWait` (a read from slow storage; the wait needs no CPU),
// batch 32 per process, a compute step of about 9 ms (one thread's matrix products), on every loading path:
//
//   sharded            map-style, each rank reads its own 32 samples         ideal max(compute, fetch / workers)
//   dispatched         map-style, rank 0 reads the global batch of 64       ideal max(compute, fetch / workers)
//   stream             an input range (read in order), sharded              ideal max(compute, fetch)
//   stream-dispatched  an input range, rank 0 reads it alone                ideal max(compute, fetch)
//
// with 0, 1 and 2 workers (0 workers: compute + fetch, nothing overlaps). `fetch` is measured alone: the time the
// rank that reads most (rank 0 when dispatched) spends reading one step's samples; `compute` is measured alone too.
// A step's time is the median over kSteps steps after kWarmup, both ranks in step (the dispatched transport is a
// collective; the sharded paths meet at a one-element all-reduce per step, as a training step's gradient sync
// would). Rank 0 writes build/bench/results.json entries to argv[1]: ratio = step time / ideal.
#include <accel/accel.hpp>

#include <ATen/Parallel.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <torch/data/example.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kWait = std::chrono::microseconds(170);
constexpr std::int64_t kBatch = 32, kFeatures = 64, kSamples = 1 << 20;
constexpr int kWarmup = 5, kSteps = 60;
constexpr double kComputeTarget = 9.1e-3;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

torch::data::Example<> sample(std::int64_t i) {
  std::this_thread::sleep_for(kWait);
  return {at::ones({kFeatures}) * double(i % 7), at::scalar_tensor(i % 3, at::kLong)};
}

//! Map-style: `get(i)` waits, then makes sample i.
struct SlowDataset {
  [[nodiscard]] std::int64_t size() const { return kSamples; }
  [[nodiscard]] torch::data::Example<> get(std::int64_t i) const { return sample(i); }
};

//! A stream (no size()): each sample waits when it is read.
struct SlowStream {
  struct iterator {
    using value_type = torch::data::Example<>;
    using difference_type = std::ptrdiff_t;
    std::int64_t i = 0;
    value_type operator*() const { return sample(i); }
    iterator& operator++() {
      ++i;
      return *this;
    }
    void operator++(int) { ++i; }
    bool operator==(std::default_sentinel_t) const { return i >= kSamples; }
  };
  [[nodiscard]] iterator begin() const { return {}; }
  [[nodiscard]] std::default_sentinel_t end() const { return {}; }
};

//! About kComputeTarget of one thread's work: `reps` products of 256 x 256 matrices.
struct Compute {
  at::Tensor a = at::randn({256, 256}), b = at::randn({256, 256});
  int reps = 1;
  void run() const {
    at::Tensor c = a;
    for (int r = 0; r < reps; ++r) c = at::mm(a, b);
    (void)c.sum().item<float>();
  }
  void calibrate() {
    for (int round = 0; round < 3; ++round) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) {
        const auto s = Clock::now();
        run();
        t.push_back(seconds_since(s) / reps);
      }
      reps = std::max(1, int(kComputeTarget / median(t) + 0.5));
    }
  }
};

template <class Loader>
double step_seconds(Loader& loader, const Compute& compute, const accel::ProcessState& state) {
  std::vector<double> times;
  at::Tensor sync = at::ones({1});
  auto it = loader.begin();
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    const auto t = Clock::now();
    const auto& batch = *it;
    (void)batch.data.size(0);
    compute.run();
    if (state.comm() && state.num_processes() > 1) state.comm()->all_reduce(sync);
    ++it;
    if (s >= kWarmup) times.push_back(seconds_since(t));
  }
  return median(times);
}

// The same reads by hand, no transport: `readers` plain threads (none: the loop reads) each read a whole batch of
// `samples` samples and stack it into a bounded queue (2 per reader); the loop pops, computes and meets the other
// rank. What a loader with no overhead would cost on this machine, where the reading takes CPU from the compute.
double hand_seconds(std::int64_t samples, int readers, const Compute& compute, const accel::ProcessState& state) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<torch::data::Example<>> queue;
  bool stop = false;
  std::int64_t next = 0;
  auto read_batch = [&](std::int64_t first) {
    std::vector<at::Tensor> data, target;
    for (std::int64_t i = 0; i < samples; ++i) {
      auto e = sample(first + i);
      data.push_back(e.data), target.push_back(e.target);
    }
    return torch::data::Example<>{at::stack(data), at::stack(target)};
  };
  if (samples == 0) readers = 0;  // a rank that reads nothing (dispatched: all but rank 0)
  std::vector<std::thread> threads;
  for (int r = 0; r < readers; ++r)
    threads.emplace_back([&] {
      for (;;) {
        std::int64_t first;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || std::int64_t(queue.size()) < 2 * readers; });
          if (stop) return;
          first = next, next += samples;
        }
        auto batch = read_batch(first);
        {
          std::lock_guard<std::mutex> lock(mu);
          queue.push_back(std::move(batch));
        }
        cv.notify_all();
      }
    });
  std::vector<double> times;
  at::Tensor sync = at::ones({1});
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    const auto t = Clock::now();
    torch::data::Example<> batch;
    if (readers == 0) {
      if (samples > 0) batch = read_batch(0);
    } else if (samples > 0) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !queue.empty(); });
      batch = std::move(queue.front());
      queue.pop_front();
      cv.notify_all();
    }
    compute.run();
    if (state.num_processes() > 1) state.comm()->all_reduce(sync);
    if (s >= kWarmup) times.push_back(seconds_since(t));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  return median(times);
}

// One step's reading alone, on the rank that reads most: `samples` samples waited for in a row.
double fetch_seconds(std::int64_t samples) {
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    for (std::int64_t i = 0; i < samples; ++i) (void)sample(i);
    times.push_back(seconds_since(t));
  }
  return median(times);
}
}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  accel::ProcessState state;
  const int N = state.num_processes();
  Compute compute;
  compute.calibrate();
  // The step without data (compute and the per-step all-reduce): what the loop costs when batches are free.
  const double compute_alone = hand_seconds(0, 0, compute, state);
  const double fetch_own = fetch_seconds(kBatch), fetch_global = fetch_seconds(kBatch * N);
  using Sharded = accel::CheckedConfig<accel::dist::gloo>;
  using Dispatched = accel::CheckedConfig<accel::dist::gloo, accel::loading::dispatched>;
  nlohmann::json entries = nlohmann::json::array();
  // `reads`: the samples this rank reads a step (a stream: by one reader at most, in order).
  auto report = [&](const std::string& path, int workers, double step, double fetch, bool in_order,
                    std::int64_t reads) {
    const double ideal =
        workers == 0 ? compute_alone + fetch : std::max(compute_alone, in_order ? fetch : fetch / workers);
    const double hand = hand_seconds(reads, in_order ? std::min(workers, 1) : workers, compute, state);
    const std::string name = "prefetch_" + path + "_" + std::to_string(workers) + "w";
    entries.push_back({{"name", name},
                       {"accel_seconds", step},
                       {"baseline", "ideal max(compute, fetch / workers)"},
                       {"baseline_seconds", ideal},
                       {"ratio", step / ideal},
                       {"goal", 1.10},
                       {"compute_seconds", compute_alone},
                       {"fetch_seconds", fetch}});
    entries.push_back({{"name", name},
                       {"accel_seconds", step},
                       {"baseline", "the same reads by hand"},
                       {"baseline_seconds", hand},
                       {"ratio", step / hand},
                       {"goal", 1.05}});
    state.print(name, ": step ", step * 1e3, " ms; ideal ", ideal * 1e3, " ms (compute ", compute_alone * 1e3,
                ", fetch ", fetch * 1e3, "): ratio ", step / ideal, "; the same reads by hand ", hand * 1e3,
                " ms: ratio ", step / hand);
  };
  const bool lead = state.process_index() == 0;
  for (const int workers : {0, 1, 2}) {
    const accel::data::DataLoaderOptions o{.batch_size = kBatch, .workers = workers, .prefetch = 2};
    {
      auto l = accel::data::prepare_data_loader<Sharded>(accel::data::DataLoader(SlowDataset{}, o), state);
      report("sharded", workers, step_seconds(l, compute, state), fetch_own, false, kBatch);
    }
    {
      auto l = accel::data::prepare_data_loader<Dispatched>(accel::data::DataLoader(SlowDataset{}, o), state);
      report("dispatched", workers, step_seconds(l, compute, state), fetch_global, false, lead ? kBatch * N : 0);
    }
    {
      // A sharded stream: every rank reads every sample of a step (each keeps its part).
      auto l = accel::data::prepare_data_loader<Sharded>(accel::data::DataLoader(SlowStream{}, o), state);
      report("stream", workers, step_seconds(l, compute, state), fetch_global, true, kBatch * N);
    }
    {
      auto l = accel::data::prepare_data_loader<Dispatched>(accel::data::DataLoader(SlowStream{}, o), state);
      report("stream_dispatched", workers, step_seconds(l, compute, state), fetch_global, true, lead ? kBatch * N : 0);
    }
  }
  if (state.is_main_process() && argc > 1) std::ofstream(argv[1]) << entries.dump(2) << "\n";
  return 0;
}
