#pragma once
//! \file
//! The definitions of `read_meta`, `parse_process_record` and `read_process_record` (checkpoint/format.hpp, included at
//! its end), kept out of user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation])
//! for their cost: 8 MB of g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/checkpoint/format.hpp>

namespace accel::checkpoint {

ACCEL_DECL Meta read_meta(std::span<const std::uint8_t> bytes, const std::string& path) {
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
    if (!has_calls)
      throw FileError(path, "damaged checkpoint description: 'tracker_last_step' without 'tracker_calls'");
    if (!calls.isInt() || (has_last && !last.isInt()))
      throw FileError(path, "damaged checkpoint description: 'tracker_calls' or 'tracker_last_step' is not an integer");
    m.trackers = tracking::Position{calls.toInt(), has_last ? std::optional(last.toInt()) : std::nullopt};
  });
  if (m.trackers && (m.trackers->calls < 0 || (m.trackers->calls > 0) != m.trackers->last_step.has_value()))
    throw FileError(path,
                    "damaged checkpoint description: 'tracker_calls' is " + std::to_string(m.trackers->calls) +
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

ACCEL_DECL ProcessRecord parse_process_record(std::span<const std::uint8_t> in, const std::string& path,
                                              std::size_t generator_state_bytes, std::int64_t version) {
  ProcessRecord r;
  // Read as the format accel_checkpoint.pt declares: a record of another format is named as read in that one.
  const std::string as_read = version == format_version ? ""
                                                        : " (read as checkpoint format " + std::to_string(version) +
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
    for (auto& l : old.loaders)
      r.loaders.push_back({.epoch = l.epoch, .batches = l.batches, .generator_state = std::move(l.generator_state)});
  } else {
    reading(path, [&] { accel::deserialize(r, in); });
  }
  if (!in.empty())
    throw FileError(path, "damaged process record: " + std::to_string(in.size()) + " bytes after its end" + as_read);
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
      throw FileError(path, which + "a generator state of " + std::to_string(l.generator_state.size()) +
                                " bytes, this LibTorch's has " + std::to_string(generator_state_bytes));
    if (const auto what = cpu_generator_state_problem(l.generator_state); !what.empty())
      throw FileError(path, which + what);
    if (version < 3) continue;
    // Format 3 describes the loader and its global position (data/loader_state.hpp).
    auto field = [&](const char* name, std::int64_t v, const std::string& range) {
      throw FileError(path, which + "'" + name + "' is " + std::to_string(v) + " (" + range + ")");
    };
    constexpr std::int64_t most = std::numeric_limits<int>::max();
    if (l.processes < 1 || l.processes > most)
      field("processes", l.processes, "the saving job's processes: 1 to 2^31 - 1");
    if (l.drawn_by < 1 || l.drawn_by > most)
      field("drawn_by", l.drawn_by, "the processes that drew the epoch's order: 1 to 2^31 - 1");
    if (l.position < 0) field("position", l.position, "samples of the epoch consumed: 0 or more");
    if (l.batch_size < 1) field("batch_size", l.batch_size, "1 or more");
    if (l.samples < -1) field("samples", l.samples, "the dataset's length, or -1 for a stream");
    if (l.kind < 0 || l.kind > std::int64_t(data::LoaderKind::stream_dispatched))
      field("kind", l.kind, "the loading path: 0 to 4");
  }
  return r;
}

ACCEL_DECL ProcessRecord read_process_record(torch::serialize::InputArchive& a, const std::string& path,
                                             std::size_t generator_state_bytes, std::int64_t version) {
  at::Tensor blob;
  reading(path, [&] { a.read("record", blob); });
  if (blob.scalar_type() != at::kByte || blob.dim() != 1 || !blob.is_contiguous() || !blob.device().is_cpu())
    throw FileError(path, "damaged process record: 'record' is not a 1-D byte tensor");
  return parse_process_record(std::span<const std::uint8_t>(blob.data_ptr<std::uint8_t>(), std::size_t(blob.numel())),
                              path, generator_state_bytes, version);
}

}  // namespace accel::checkpoint
