#pragma once
// Shared by the libFuzzer targets and the seed generator: the model whose archive fuzz/model_archive.cpp reads,
// and the one outcome a reader may have besides success (accel::FileError). Any other exception escapes
// LLVMFuzzerTestOneInput, which libFuzzer reports as a crash with the input that caused it.
#include <accel/error.hpp>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace accel_fuzz {

inline torch::nn::Sequential small_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 3));
}

template <class Read>
int run(const std::uint8_t* data, std::size_t size, Read&& read) {
  try {
    read(std::span<const std::uint8_t>(data, size));
  } catch (const accel::FileError&) {
  }
  return 0;
}

}  // namespace accel_fuzz
