#pragma once
// A toy model and dataset shared by the training tests (accumulation, checkpoint, accelerator).
#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>

#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace accel_test {

//! One process, no communication.
struct Solo : accel::Accelerator<accel::dist::none> {};

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(at::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Net);

//! n samples of 6 features and a class in [0, 3), the same every time.
inline accel::data::TensorDataset toy_data(std::int64_t n) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  auto x = at::randn({n, 6}, g);
  auto y = at::randint(0, 3, {n}, g);
  return {x, y};
}

template <class Holder>
std::vector<at::Tensor> snapshot_of(const Holder& net) {
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

//! Equal parameter snapshots, tensor by tensor (bit for bit).
inline void check_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(at::equal(a[i], b[i]));
}

}  // namespace accel_test
