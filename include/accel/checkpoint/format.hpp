#pragma once
//! \file
//! The checkpoint directory that `Accelerator::save_state` writes and `load_state` reads.
//!
//! ```
//! <dir>/
//!   accel_checkpoint.pt       what the checkpoint holds: format version, number of processes, how many models,
//!                             optimizers, schedulers and loaders were prepared, whether a GradScaler runs, and
//!                             the training settings that shape the trajectory (mixed precision, accumulation
//!                             steps), the experiment trackers' position (`log` calls so far, the last step; both
//!                             absent in checkpoints of earlier accel versions)
//!   model.pt, model_1.pt ...  each prepared model's parameters and buffers, by name (main process)
//!   optimizer.pt, ...         each optimizer's parameter groups (learning rates included) and buffers (main)
//!   scheduler.pt, ...         each scheduler's step counter (main)
//!   scaler.pt                 the GradScaler's scale and growth counter (main; fp16 only)
//!   custom_checkpoint_<i>.pt  each object given to `register_for_checkpointing`: its type and state (main;
//!                             custom.hpp)
//!   process_<r>.pt            per process r: the accumulation step counter, the CPU generator's state, the
//!                             GPU generator's state (on a GPU), every prepared loader's state (epoch, global
//!                             position in the epoch's order, batches already handed out, the sampler generator's
//!                             state at the epoch start, what the loader was), whether it was saved inside an
//!                             accumulation window, and then the process's local gradients
//!   manifest.txt              every file above with its size and CRC-32C (manifest.hpp), written last
//! ```
//!
//! The index suffix follows Accelerate (`model.pt` for the first, `model_1.pt` for the second, in `prepare`
//! order). Every file is a LibTorch archive (`torch::serialize::OutputArchive`), readable with
//! `torch::serialize::InputArchive`. A checkpoint is
//! written into `<dir>.partial` and renamed into place once every process has written its part and the main process
//! has written the manifest, so `<dir>` always holds a complete checkpoint (the previous one until the new one is
//! whole). Loading verifies each file against the manifest before reading it, and every file is read by the
//! functions below, which check what they read and throw one `accel::FileError` naming the file.

#include <accel/checkpoint/archive.hpp>
#include <accel/core/generator_state.hpp>
#include <accel/core/serialize.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <ATen/core/Tensor.h>

#include <torch/serialize/archive.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

//! Checkpoints: the directory's layout, the checkpointer, projects, custom objects, the manifest, the checked readers
//! of torch archives and pickles, and safetensors.
namespace accel::checkpoint {

// 2: the manifest (format 1 had none). 3: custom objects; loader states with a global position and a description
// of the loader, and the accumulation-window flag (resuming at another number of processes). Format 2 is still
// read (no custom objects; resumed with its own number of processes).
inline constexpr std::int64_t format_version = 3;      //!< the format this accel writes
inline constexpr std::int64_t oldest_format_read = 2;  //!< the oldest format it reads

//! `model.pt`, `model_1.pt`, ...: Accelerate's suffix rule.
inline std::string indexed(const std::string& stem, std::size_t i) {
  return i == 0 ? stem + ".pt" : stem + "_" + std::to_string(i) + ".pt";
}
//! `process_<r>.pt`: process r's record.
inline std::string process_file(int rank) { return "process_" + std::to_string(rank) + ".pt"; }
inline constexpr const char* meta_file = "accel_checkpoint.pt";  //!< the job's description (`Meta`)
inline constexpr const char* scaler_file = "scaler.pt";          //!< the GradScaler's state

//! What `process_<r>.pt` holds besides local gradients (serialised with accel's own `accel::serialize`, one
//! byte tensor under the key "record").
struct ProcessRecord {
  std::int64_t step = 0;  //!< the accumulation step counter (Accelerate's `step`)
  //!@{
  //! Generator states: the CPU's, and the device's (empty on the CPU).
  std::vector<std::uint8_t> rng_cpu, rng_device;
  //!@}
  std::vector<data::LoaderState> loaders;  //!< every prepared loader, in prepare order
  bool local_gradients = false;            //!< saved inside an accumulation window (the archive holds gradients)
};
//! The record's fields, for accel's typed serialisation.
inline auto accel_fields(ProcessRecord& r) {
  return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders, r.local_gradients);
}
//! The record's fields, read-only.
inline auto accel_fields(const ProcessRecord& r) {
  return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders, r.local_gradients);
}

namespace detail {
// Format 2's record: loader states of three fields, no accumulation flag.
struct LoaderStateV2 {
  std::int64_t epoch = 0, batches = 0;
  std::vector<std::uint8_t> generator_state;
};
inline auto accel_fields(LoaderStateV2& s) { return std::tie(s.epoch, s.batches, s.generator_state); }
struct ProcessRecordV2 {
  std::int64_t step = 0;
  std::vector<std::uint8_t> rng_cpu, rng_device;
  std::vector<LoaderStateV2> loaders;
};
inline auto accel_fields(ProcessRecordV2& r) { return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders); }
}  // namespace detail

//! `<dir>.partial`: where a checkpoint is written before it is swapped in whole.
inline std::filesystem::path partial_dir(const std::filesystem::path& dir) {
  return std::filesystem::path(dir.string() + ".partial");
}

//! Writes the integer `v` under `key`.
inline void write(torch::serialize::OutputArchive& a, const std::string& key, std::int64_t v) {
  a.write(key, c10::IValue(v));
}
//! Reads the integer under `key`.
inline std::int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

//! What `accel_checkpoint.pt` holds.
//! The training settings a checkpoint records and `load_state` compares: another value changes the trajectory.
struct Settings {
  std::string mixed_precision = "no";            //!< "no", "fp16" or "bf16" (Options::mixed_precision)
  std::int64_t gradient_accumulation_steps = 1;  //!< Options::gradient_accumulation_steps
};
//! The job's description in `accel_checkpoint.pt`: the format, the number of processes, how many objects of each kind
//! were saved, and the trackers' position and training settings.
struct Meta {
  //!@{
  //! The format, the number of processes that saved, and how many models, optimizers, schedulers, loaders, scalers
  //! (0 or 1) and custom objects the checkpoint holds.
  std::int64_t format_version = 0, num_processes = 0, models = 0, optimizers = 0, schedulers = 0, loaders = 0,
               scaler = 0, custom = 0;
  //!@}
  //! The trackers' position (tracking/trackers.hpp), under the keys "tracker_calls" and "tracker_last_step" (the
  //! latter only after a first `log` call); none: not recorded (an earlier accel's checkpoint, optional keys in the
  //! same format, or a job that continued such a checkpoint's files).
  std::optional<tracking::Position> trackers = std::nullopt;
  //! The training settings, under the keys "mixed_precision" (0 no, 1 fp16, 2 bf16) and
  //! "gradient_accumulation_steps"; none: not recorded (a checkpoint written before them compares nothing).
  std::optional<Settings> settings = std::nullopt;
};
//! The names of the precisions, by their number in `Meta` (0 no, 1 fp16, 2 bf16).
inline constexpr std::array<const char*, 3> precision_names{"no", "fp16", "bf16"};

//! Meta's fields under their archive keys: the one list that writing and reading follow.
template <class M>  // Meta or const Meta
auto meta_fields(M& m) {
  using Field = std::pair<const char*, decltype(&m.format_version)>;
  return std::array<Field, 8>{Field{"format_version", &m.format_version},
                              {"num_processes", &m.num_processes},
                              {"models", &m.models},
                              {"optimizers", &m.optimizers},
                              {"schedulers", &m.schedulers},
                              {"loaders", &m.loaders},
                              {"scaler", &m.scaler},
                              {"custom", &m.custom}};
}

//! Writes `accel_checkpoint.pt`'s archive.
inline void write_meta(torch::serialize::OutputArchive& a, const Meta& m) {
  for (const auto& [key, field] : meta_fields(m)) write(a, key, *field);
  if (m.trackers) {
    write(a, "tracker_calls", m.trackers->calls);
    if (m.trackers->last_step) write(a, "tracker_last_step", *m.trackers->last_step);
  }
  if (m.settings) {
    std::int64_t code = 0;
    while (code < std::int64_t(precision_names.size()) &&
           m.settings->mixed_precision != precision_names[std::size_t(code)])
      ++code;
    write(a, "mixed_precision", code);
    write(a, "gradient_accumulation_steps", m.settings->gradient_accumulation_steps);
  }
}

//! The training settings of `accel_checkpoint.pt`'s archive, when it records them (`path` names it in errors); every
//! value is checked against what `Options` accepts.
inline std::optional<Settings> read_settings(torch::serialize::InputArchive& a, const std::string& path) {
  c10::IValue precision, steps;
  const bool has_precision = a.try_read("mixed_precision", precision);
  const bool has_steps = a.try_read("gradient_accumulation_steps", steps);
  if (!has_precision && !has_steps) return std::nullopt;
  if (!has_precision || !has_steps || !precision.isInt() || !steps.isInt())
    throw FileError(
        path, "damaged training settings: 'mixed_precision' and 'gradient_accumulation_steps' must both be integers");
  const std::int64_t code = precision.toInt(), n = steps.toInt();
  if (code < 0 || code >= std::int64_t(precision_names.size()))
    throw FileError(
        path, "damaged training settings: 'mixed_precision' is " + std::to_string(code) + " (0 no, 1 fp16, 2 bf16)");
  if (n < 1 || n > std::numeric_limits<int>::max())
    throw FileError(path, "damaged training settings: 'gradient_accumulation_steps' is " + std::to_string(n) +
                              " (1 to " + std::to_string(std::numeric_limits<int>::max()) + ")");
  return Settings{precision_names[std::size_t(code)], n};
}

//! Reads `accel_checkpoint.pt` from its bytes (`path` names it in errors).
ACCEL_DECL Meta read_meta(std::span<const std::uint8_t> bytes, const std::string& path);

//! Parses a process record's bytes (the "record" tensor of `process_<r>.pt`, the file `path`, of checkpoint format
//! `version`): deserialised whole, every generator state of the size this LibTorch's CPU generator has
//! (`generator_state_bytes`). A format-2 record's loader states have no position (-1: they resume after their
//! batches, with the same number of processes).
ACCEL_DECL ProcessRecord parse_process_record(std::span<const std::uint8_t> in, const std::string& path,
                                              std::size_t generator_state_bytes, std::int64_t version = format_version);

//! Reads the record of `process_<r>.pt` (opened into `a`).
ACCEL_DECL ProcessRecord read_process_record(torch::serialize::InputArchive& a, const std::string& path,
                                             std::size_t generator_state_bytes, std::int64_t version = format_version);

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/format.ipp>
#endif
