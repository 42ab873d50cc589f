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

namespace accel::checkpoint {

// 2: the manifest (format 1 had none). 3: custom objects; loader states with a global position and a description
// of the loader, and the accumulation-window flag (resuming at another number of processes). Format 2 is still
// read (no custom objects; resumed with its own number of processes).
inline constexpr std::int64_t format_version = 3;
inline constexpr std::int64_t oldest_format_read = 2;

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
  bool local_gradients = false;                 //!< saved inside an accumulation window (the archive holds gradients)
};
inline auto accel_fields(ProcessRecord& r) { return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders, r.local_gradients); }
inline auto accel_fields(const ProcessRecord& r) { return std::tie(r.step, r.rng_cpu, r.rng_device, r.loaders, r.local_gradients); }

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

inline std::filesystem::path partial_dir(const std::filesystem::path& dir) {
  return std::filesystem::path(dir.string() + ".partial");
}

inline void write(torch::serialize::OutputArchive& a, const std::string& key, std::int64_t v) { a.write(key, c10::IValue(v)); }
inline std::int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

//! What `accel_checkpoint.pt` holds.
//! The training settings a checkpoint records and `load_state` compares: another value changes the trajectory.
struct Settings {
  std::string mixed_precision = "no";           //!< "no", "fp16" or "bf16" (Options::mixed_precision)
  std::int64_t gradient_accumulation_steps = 1;
};
struct Meta {
  std::int64_t format_version = 0, num_processes = 0, models = 0, optimizers = 0, schedulers = 0, loaders = 0, scaler = 0,
               custom = 0;
  //! The trackers' position (tracking/trackers.hpp), under the keys "tracker_calls" and "tracker_last_step" (the
  //! latter only after a first `log` call); none: not recorded (an earlier accel's checkpoint, optional keys in the
  //! same format, or a job that continued such a checkpoint's files).
  std::optional<tracking::Position> trackers = std::nullopt;
  //! The training settings, under the keys "mixed_precision" (0 no, 1 fp16, 2 bf16) and
  //! "gradient_accumulation_steps"; none: not recorded (a checkpoint written before them compares nothing).
  std::optional<Settings> settings = std::nullopt;
};
inline constexpr std::array<const char*, 3> precision_names{"no", "fp16", "bf16"};

//! Meta's fields under their archive keys: the one list that writing and reading follow.
template <class M>  // Meta or const Meta
auto meta_fields(M& m) {
  using Field = std::pair<const char*, decltype(&m.format_version)>;
  return std::array<Field, 8>{Field{"format_version", &m.format_version}, {"num_processes", &m.num_processes},
                              {"models", &m.models}, {"optimizers", &m.optimizers}, {"schedulers", &m.schedulers},
                              {"loaders", &m.loaders}, {"scaler", &m.scaler}, {"custom", &m.custom}};
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
    while (code < std::int64_t(precision_names.size()) && m.settings->mixed_precision != precision_names[std::size_t(code)])
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
    throw FileError(path, "damaged training settings: 'mixed_precision' and 'gradient_accumulation_steps' must both be integers");
  const std::int64_t code = precision.toInt(), n = steps.toInt();
  if (code < 0 || code >= std::int64_t(precision_names.size()))
    throw FileError(path, "damaged training settings: 'mixed_precision' is " + std::to_string(code) + " (0 no, 1 fp16, 2 bf16)");
  if (n < 1 || n > std::numeric_limits<int>::max())
    throw FileError(path, "damaged training settings: 'gradient_accumulation_steps' is " + std::to_string(n) + " (1 to " +
                              std::to_string(std::numeric_limits<int>::max()) + ")");
  return Settings{precision_names[std::size_t(code)], n};
}

//! Reads `accel_checkpoint.pt` from its bytes (`path` names it in errors).
inline Meta read_meta(std::span<const std::uint8_t> bytes, const std::string& path) {
  torch::serialize::InputArchive a;
  load_archive(a, bytes, path);
  Meta m;
  reading(path, [&] {
    m.format_version = read_int(a, "format_version");
    if (m.format_version < oldest_format_read || m.format_version > format_version) return;
    for (const auto& [key, field] : meta_fields(m))
      if (field != &m.format_version && (m.format_version > 2 || field != &m.custom)) *field = read_int(a, key);
    c10::IValue calls, last;
    const bool has_calls = a.try_read("tracker_calls", calls), has_last = a.try_read("tracker_last_step", last);
    if (!has_calls && !has_last) return;
    if (!has_calls) throw FileError(path, "damaged checkpoint description: 'tracker_last_step' without 'tracker_calls'");
    if (!calls.isInt() || (has_last && !last.isInt()))
      throw FileError(path, "damaged checkpoint description: 'tracker_calls' or 'tracker_last_step' is not an integer");
    m.trackers = tracking::Position{calls.toInt(), has_last ? std::optional(last.toInt()) : std::nullopt};
  });
  if (m.trackers && (m.trackers->calls < 0 || (m.trackers->calls > 0) != m.trackers->last_step.has_value()))
    throw FileError(path, "damaged checkpoint description: 'tracker_calls' is " + std::to_string(m.trackers->calls) +
                              (m.trackers->last_step ? " with" : " without") +
                              " a 'tracker_last_step' (the trackers' log calls: 0 or more, and a last step after 1 or more)");
  if (m.format_version < oldest_format_read || m.format_version > format_version)
    throw FileError(path, "checkpoint format " + std::to_string(m.format_version) + ", this accel reads formats " +
                              std::to_string(oldest_format_read) + " to " + std::to_string(format_version));
  if (m.num_processes < 1 || m.models < 0 || m.optimizers < 0 || m.schedulers < 0 || m.loaders < 0 || m.custom < 0 ||
      (m.scaler != 0 && m.scaler != 1))
    throw FileError(path, "damaged checkpoint description: a negative count or an unknown scaler flag");
  m.settings = reading(path, [&] { return read_settings(a, path); });
  return m;
}

//! Parses a process record's bytes (the "record" tensor of `process_<r>.pt`, the file `path`, of checkpoint format
//! `version`): deserialised whole, every generator state of the size this LibTorch's CPU generator has
//! (`generator_state_bytes`). A format-2 record's loader states have no position (-1: they resume after their
//! batches, with the same number of processes).
inline ProcessRecord parse_process_record(std::span<const std::uint8_t> in, const std::string& path,
                                          std::size_t generator_state_bytes, std::int64_t version = format_version) {
  ProcessRecord r;
  // Read as the format accel_checkpoint.pt declares: a record of another format is named as read in that one.
  const std::string as_read = version == format_version ? "" : " (read as checkpoint format " + std::to_string(version) +
                                                                   ", which accel_checkpoint.pt declares)";
  if (version == 2) {
    detail::ProcessRecordV2 old;
    try {
      accel::deserialize(old, in);
    } catch (const std::exception& e) {
      throw FileError(path, e.what() + as_read);
    }
    r.step = old.step;
    r.rng_cpu = std::move(old.rng_cpu);
    r.rng_device = std::move(old.rng_device);
    for (auto& l : old.loaders) r.loaders.push_back({.epoch = l.epoch, .batches = l.batches, .generator_state = std::move(l.generator_state)});
  } else {
    reading(path, [&] { accel::deserialize(r, in); });
  }
  if (!in.empty()) throw FileError(path, "damaged process record: " + std::to_string(in.size()) + " bytes after its end" + as_read);
  if (r.step < 0) throw FileError(path, "damaged process record: a negative step counter");
  if (r.rng_cpu.size() != generator_state_bytes)
    throw FileError(path, "damaged process record: a CPU generator state of " + std::to_string(r.rng_cpu.size()) +
                              " bytes, this LibTorch's has " + std::to_string(generator_state_bytes));
  if (const auto what = cpu_generator_state_problem(r.rng_cpu); !what.empty())
    throw FileError(path, "damaged process record: the CPU generator's state: " + what);
  for (std::size_t i = 0; i < r.loaders.size(); ++i) {
    const auto& l = r.loaders[i];
    const std::string which = "damaged loader state " + std::to_string(i) + ": ";
    if (l.epoch < 0 || l.batches < 0 || l.position < -1 || l.processes < 0 || l.drawn_by < 0)
      throw FileError(path, which + "a negative epoch, batch count, position or process count");
    if (!l.generator_state.empty() && l.generator_state.size() != generator_state_bytes)
      throw FileError(path, which + "a generator state of " + std::to_string(l.generator_state.size()) + " bytes, this LibTorch's has " +
                                std::to_string(generator_state_bytes));
    if (const auto what = cpu_generator_state_problem(l.generator_state); !what.empty()) throw FileError(path, which + what);
    if (version < 3) continue;
    // Format 3 describes the loader and its global position (data/loader_state.hpp).
    auto field = [&](const char* name, std::int64_t v, const std::string& range) {
      throw FileError(path, which + "'" + name + "' is " + std::to_string(v) + " (" + range + ")");
    };
    constexpr std::int64_t most = std::numeric_limits<int>::max();
    if (l.processes < 1 || l.processes > most) field("processes", l.processes, "the saving job's processes: 1 to 2^31 - 1");
    if (l.drawn_by < 1 || l.drawn_by > most) field("drawn_by", l.drawn_by, "the processes that drew the epoch's order: 1 to 2^31 - 1");
    if (l.position < 0) field("position", l.position, "samples of the epoch consumed: 0 or more");
    if (l.batch_size < 1) field("batch_size", l.batch_size, "1 or more");
    if (l.samples < -1) field("samples", l.samples, "the dataset's length, or -1 for a stream");
    if (l.kind < 0 || l.kind > std::int64_t(data::LoaderKind::stream_dispatched))
      field("kind", l.kind, "the loading path: 0 to 4");
  }
  return r;
}

//! Reads the record of `process_<r>.pt` (opened into `a`).
inline ProcessRecord read_process_record(torch::serialize::InputArchive& a, const std::string& path,
                                         std::size_t generator_state_bytes, std::int64_t version = format_version) {
  at::Tensor blob;
  reading(path, [&] { a.read("record", blob); });
  if (blob.scalar_type() != at::kByte || blob.dim() != 1 || !blob.is_contiguous() || !blob.device().is_cpu())
    throw FileError(path, "damaged process record: 'record' is not a 1-D byte tensor");
  return parse_process_record(std::span<const std::uint8_t>(blob.data_ptr<std::uint8_t>(), std::size_t(blob.numel())), path,
                              generator_state_bytes, version);
}

}  // namespace accel::checkpoint
