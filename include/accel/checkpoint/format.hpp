#pragma once
//! \file
//! The checkpoint directory that `Accelerator::save_state` writes and `load_state` reads.
//!
//! ```
//! <dir>/
//!   accel_checkpoint.pt       what the checkpoint holds: format version, number of processes, how many models,
//!                             optimizers, schedulers and loaders were prepared, whether a GradScaler runs
//!   model.pt, model_1.pt ...  each prepared model's parameters and buffers, by name (main process)
//!   optimizer.pt, ...         each optimizer's parameter groups (learning rates included) and buffers (main)
//!   scheduler.pt, ...         each scheduler's step counter (main)
//!   scaler.pt                 the GradScaler's scale and growth counter (main; fp16 only)
//!   process_<r>.pt            per process r: the accumulation step counter, the CPU generator's state, the
//!                             GPU generator's state (on a GPU), every prepared loader's state (epoch,
//!                             batches already handed out, the sampler generator's state at the epoch start),
//!                             and, when saved inside an accumulation window, the process's local gradients
//! ```
//!
//! The index suffix follows Accelerate (`model.pt` for the first, `model_1.pt` for the second, in `prepare`
//! order). Every file is a LibTorch archive (`torch::serialize::OutputArchive`), readable with
//! `torch::serialize::InputArchive`. A checkpoint is
//! written into `<dir>.partial` and renamed into place once every process has written its part, so `<dir>`
//! always holds a complete checkpoint (the previous one until the new one is whole).

#include <accel/data/loader_state.hpp>
#include <accel/error.hpp>

#include <torch/serialize/archive.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

namespace accel::checkpoint {

inline constexpr std::int64_t format_version = 1;

//! `model.pt`, `model_1.pt`, ...: Accelerate's suffix rule.
inline std::string indexed(const std::string& stem, std::size_t i) {
  return i == 0 ? stem + ".pt" : stem + "_" + std::to_string(i) + ".pt";
}
inline std::string process_file(int rank) { return "process_" + std::to_string(rank) + ".pt"; }
inline constexpr const char* meta_file = "accel_checkpoint.pt";
inline constexpr const char* scaler_file = "scaler.pt";

//! What `process_<r>.pt` holds besides local gradients (serialised with accel's own `accel::serialize`, one
//! byte tensor under the key "record").
struct ProcessRecord {
  std::int64_t step = 0;                        //!< the accumulation step counter (Accelerate's `step`)
  std::vector<std::uint8_t> rng_cpu, rng_device;  //!< generator states (rng_device empty on the CPU)
  std::vector<data::LoaderState> loaders;       //!< every prepared loader, in prepare order
};
inline auto accel_fields(ProcessRecord& r) { return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders); }
inline auto accel_fields(const ProcessRecord& r) { return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders); }

inline std::filesystem::path partial_dir(const std::filesystem::path& dir) {
  return std::filesystem::path(dir.string() + ".partial");
}

inline void write(torch::serialize::OutputArchive& a, const std::string& key, std::int64_t v) { a.write(key, c10::IValue(v)); }
inline std::int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

//! Opens `dir/name` for reading, or says which file of the checkpoint is missing.
inline void open(torch::serialize::InputArchive& a, const std::filesystem::path& dir, const std::string& name,
                 c10::optional<c10::Device> device = c10::nullopt) {
  const auto path = dir / name;
  detail::require(std::filesystem::exists(path), "accel::load_state: " + path.string() +
                                                     " is missing; the checkpoint is incomplete or was written by a "
                                                     "different job (it needs the same prepared objects and processes)");
  a.load_from(path.string(), device);
}

}  // namespace accel::checkpoint
