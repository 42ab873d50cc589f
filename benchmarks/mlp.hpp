#pragma once
// What the training benchmarks share (train_bench.cpp, overhead_bench.cpp): the MLPs they train and their timers.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;
inline constexpr std::int64_t kClasses = 10;

//! An MLP `inputs`-`hidden`x`layers`-10 and how a benchmark runs it (batch per process, warm-up and timed steps).
struct Size {
  const char* name;
  std::int64_t batch, inputs, hidden, layers;
  int warmup, steps;
};

inline torch::nn::Sequential make_net(const Size& z) {
  torch::nn::Sequential net(torch::nn::Linear(z.inputs, z.hidden), torch::nn::ReLU());
  for (std::int64_t l = 1; l < z.layers; ++l)
    net->push_back(torch::nn::Linear(z.hidden, z.hidden)), net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(z.hidden, kClasses));
  return net;
}

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
