#pragma once
// The file readers under attack, each as accel runs it on a file's bytes: shared by the ctest campaign
// (tests/fuzz/campaign.cpp) and the libFuzzer targets (fuzz/), so both fuzz exactly what the library reads.
#include "plan/golden.hpp"

#include <accel/checkpoint/archive.hpp>
#include <accel/checkpoint/format.hpp>
#include <accel/checkpoint/manifest.hpp>
#include <accel/checkpoint/safetensors.hpp>
#include <accel/core/generator_state.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace readers {

using Bytes = std::span<const std::uint8_t>;

inline std::string_view text(Bytes b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

//! The model whose archives are read (model.pt, and the optimizer over its parameters).
inline torch::nn::Sequential small_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 3));
}

inline void manifest(Bytes b, const std::string& path) { (void)accel::checkpoint::Manifest::parse(text(b), path); }

inline void process_record(Bytes b, const std::string& path) {
  static const std::size_t state = accel::generator_bytes(at::detail::getDefaultCPUGenerator()).size();
  (void)accel::checkpoint::parse_process_record(b, path, state);
}

//! A model's archive, as load_state reads it: checked, its layout compared with `target`'s, then loaded.
inline void model(Bytes b, const std::string& path, torch::nn::Module& target) {
  torch::serialize::InputArchive in;
  accel::checkpoint::load_archive(in, b, path);
  accel::checkpoint::check_module(target, in, path);
  accel::checkpoint::reading(path, [&] { target.load(in); });
}

//! accel-plan's golden file: read, then every case recomputed; returns the cases that passed.
inline std::size_t golden(Bytes b, const std::string& path) {
  return accel_plan::check_golden(accel_plan::read_golden(text(b), path), path).passed;
}

//! A safetensors checkpoint directory read whole (load_safetensors_sharded: the index, then every shard), its file
//! `name` (the index or a shard) replaced by `b`. A refusal must name a file of the directory (a damaged index may
//! be refused by the shard it now misnames); it becomes the FileError of the file changed. Returns the tensors read.
inline std::size_t safetensors_dir(Bytes b, const std::filesystem::path& dir, const std::string& name) {
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  try {
    return accel::checkpoint::load_safetensors_sharded(dir).size();
  } catch (const accel::checkpoint::SafetensorsError& e) {
    const std::string what = e.what();
    if (what.rfind("accel: " + dir.string() + "/", 0) != 0)
      throw std::runtime_error("a SafetensorsError naming no file of the checkpoint: " + what);
    throw accel::FileError(path.string(), what);
  }
}

}  // namespace readers
