#pragma once
//! \file
//! The definitions of `Checkpointer::save` and `load` (checkpoint/checkpointer.hpp, included at its end), kept out of
//! user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for their cost: 13 MB
//! of g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/checkpoint/checkpointer.hpp>

namespace accel::checkpoint {

ACCEL_DECL void Checkpointer::save(const std::filesystem::path& dir, const Process& p, std::int64_t step,
                                   bool local_gradients, const Settings& settings,
                                   const std::optional<tracking::Position>& trackers) const {
  const auto tmp = partial_dir(dir);
  const bool main = p.index == 0;
  if (main) {
    std::filesystem::remove_all(tmp);
    std::filesystem::create_directories(tmp);
  }
  p.barrier();
  if (main) {
    save_one(
        [&](auto& a) {
          write_meta(a, {format_version, p.count, std::int64_t(models_.size()), std::int64_t(optimizers_.size()),
                         std::int64_t(schedulers_.size()), std::int64_t(loaders_.size()), scaler_ ? 1 : 0,
                         std::int64_t(custom_.size()), trackers, settings});
        },
        tmp / meta_file);
  }
  // Models: the main process writes each whole; a fully sharded one is written by every process, its own shards, or
  // gathered (collective: every process, in model order) for the main process to write whole.
  for (std::size_t i = 0; i < models_.size(); ++i) {
    const auto& sharded = sharded_[i];
    if (sharded && sharded->write_shards) {
      save_one(sharded->save, tmp / model_shard_file(i, p.index));
      continue;
    }
    std::optional<Whole> whole;
    if (sharded) whole.emplace(*sharded);
    if (main) save_one([&](auto& a) { models_[i]->save(a); }, tmp / indexed("model", i));
  }
  if (main) {
    for (std::size_t i = 0; i < optimizers_.size(); ++i) save_one(optimizers_[i].save, tmp / indexed("optimizer", i));
    for (std::size_t i = 0; i < schedulers_.size(); ++i) save_one(schedulers_[i].save, tmp / indexed("scheduler", i));
    if (scaler_) save_one(scaler_->save, tmp / scaler_file);
    for (std::size_t i = 0; i < custom_.size(); ++i)
      save_one([&](auto& a) { save_custom(custom_[i], a); }, tmp / custom_file(i));
  }
  for (std::size_t i = 0; i < partitions_.size(); ++i)
    save_one(partitions_[i].own.save, tmp / partition_file(i, p.index));
  {
    ProcessRecord record{step, generator_bytes(at::detail::getDefaultCPUGenerator()), {}, {}, local_gradients};
    if (p.device.is_cuda()) record.rng_device = generator_bytes(at::globalContext().defaultGenerator(p.device));
    for (const auto& l : loaders_) record.loaders.push_back(l.save());
    std::vector<std::uint8_t> blob;
    accel::serialize(record, blob);
    torch::serialize::OutputArchive a;
    a.write("record", accel::detail::bytes_tensor(blob, c10::Device(c10::kCPU)));
    if (local_gradients)
      for (std::size_t m = 0; m < models_.size(); ++m)
        for (const auto& param : models_[m]->named_parameters())
          if (param.value().grad().defined()) a.write(grad_key(m, param.key()), param.value().grad());
    a.save_to((tmp / process_file(p.index)).string());
  }
  p.barrier();
  if (main) {
    Manifest::of_directory(tmp).write(tmp);  // last: it makes the directory a complete checkpoint
    swap_in(tmp, dir);
  }
  p.barrier();
}

ACCEL_DECL std::int64_t Checkpointer::load_checked(const std::filesystem::path& given, const Process& p,
                                                   const Settings& settings, bool allow_changed_settings,
                                                   std::optional<tracking::Position>* trackers,
                                                   const std::function<std::string(const std::string&)>& agree) {
  // A crash between the two renames of a save without an atomic exchange leaves the old checkpoint aside.
  const auto aside = std::filesystem::path(given.string() + ".old");
  const auto dir = !std::filesystem::exists(given) && std::filesystem::is_directory(aside) ? aside : given;
  accel::detail::require(std::filesystem::is_directory(dir),
                         "accel::load_state: " + dir.string() + " is not a checkpoint directory");
  // Nothing is restored until every file this process reads has matched the manifest and been parsed.
  const auto manifest = Manifest::read(dir);
  manifest.check_sizes(dir);
  const auto meta_path = (dir / meta_file).string();
  const Meta meta = read_meta(manifest.read(dir, meta_file), meta_path);
  std::vector<char> shard_files(models_.size(), 0);  // per model: saved as each process's shards
  // Every process of the saving job wrote its record (and its ZeRO partitions): the description's count of
  // processes must match the files the manifest lists (a count from elsewhere would otherwise be blamed on a file
  // that is merely missing).
  {
    auto listed = [&](const std::string& name) {
      return std::any_of(manifest.files.begin(), manifest.files.end(), [&](const auto& e) { return e.name == name; });
    };
    auto missing = [&](const std::string& name) {
      throw FileError(meta_path, "says " + std::to_string(meta.num_processes) +
                                     " process(es) wrote the checkpoint, and its "
                                     "manifest lists no " +
                                     name + " (one of the two files is not this checkpoint's)");
    };
    if (std::uint64_t(meta.num_processes) > manifest.files.size()) missing(process_file(int(manifest.files.size())));
    // A model saved as shards (model_<i>_rank<r>.pt) rather than whole (model.pt): each process wrote its own.
    for (std::size_t i = 0; i < models_.size() && i < std::size_t(std::max<std::int64_t>(meta.models, 0)); ++i)
      shard_files[i] = listed(model_shard_file(i, 0));
    for (std::int64_t r = 0; r < meta.num_processes; ++r) {
      if (!listed(process_file(int(r)))) missing(process_file(int(r)));
      for (std::size_t i = 0; i < partitions_.size(); ++i)
        if (!listed(partition_file(i, int(r)))) missing(partition_file(i, int(r)));
      for (std::size_t i = 0; i < models_.size(); ++i)
        if (shard_files[i] && !listed(model_shard_file(i, int(r)))) missing(model_shard_file(i, int(r)));
    }
  }
  const bool resized = meta.num_processes != p.count;
  accel::detail::require(!resized || meta.format_version >= 3,
                         "accel::load_state: " + dir.string() + " was written by " +
                             std::to_string(meta.num_processes) + " process(es) in checkpoint format " +
                             std::to_string(meta.format_version) + ", this job has " + std::to_string(p.count) +
                             "; that format records the loaders' positions per process: resume "
                             "it with the same number of processes");
  expect_count(meta.models, dir, "models", models_.size());
  expect_count(meta.optimizers, dir, "optimizers", optimizers_.size());
  expect_count(meta.schedulers, dir, "schedulers", schedulers_.size());
  expect_count(meta.loaders, dir, "loaders", loaders_.size());
  expect_count(meta.custom, dir, "custom objects", custom_.size(), "registered",
               "register_for_checkpointing the same objects");
  accel::detail::require((meta.scaler != 0) == bool(scaler_),
                         "accel::load_state: " + meta_path + " records " + (meta.scaler ? "a" : "no") +
                             " GradScaler and this job has " + (scaler_ ? "one" : "none") +
                             ": the checkpoint and this job disagree on mixed precision (GradScaler present in one "
                             "only); use the same Options::mixed_precision");
  struct Opened {
    std::string path;
    torch::serialize::InputArchive archive;
  };
  // Models, optimizers, schedulers and the scaler are mapped to this process's device; its own record stays on
  // the CPU (its bytes and generator states are read there; gradients move to their parameters' devices).
  auto open = [&](const std::string& name, std::optional<c10::Device> device) {
    Opened o{(dir / name).string(), {}};
    load_archive(o.archive, manifest.read(dir, name), o.path, device);
    return o;
  };
  // An optimizer's, scheduler's or the scaler's archive, opened and refused (naming the file) by the object's check.
  auto open_checked = [&](const std::string& name, const Saveable& s) {
    Opened o = open(name, p.device);
    if (s.check) reading(o.path, [&] { s.check(o.archive); });
    return o;
  };
  std::vector<Opened> optimizers, schedulers;
  std::vector<std::optional<Opened>> models(models_.size());
  // A fully sharded model's shards: this process's own (each checked against the model's units), or at another
  // number of processes every saved process's.
  std::vector<std::vector<torch::serialize::InputArchive>> model_shards(models_.size());
  std::vector<std::string> model_shards_path(models_.size());
  for (std::size_t i = 0; i < models_.size(); ++i) {
    if (!shard_files[i]) {
      models[i] = open(indexed("model", i), p.device);
      check_module(*models_[i], models[i]->archive, models[i]->path, "");
      continue;
    }
    if (!sharded_[i])
      throw InvalidArgument("accel::load_state: " + dir.string() + " holds model " + std::to_string(i) +
                            " as the shards of " + std::to_string(meta.num_processes) + " process(es) (" +
                            model_shard_file(i, 0) +
                            ", ...), saved under accel::shard::parameters; this job's model is not fully sharded: "
                            "resume with accel::shard::parameters and the same Options::sharding, or save the job "
                            "with ShardingOptions::state_dict_type = StateDictType::full to get a whole model.pt");
    const std::int64_t count = resized ? meta.num_processes : 1;
    for (std::int64_t k = 0; k < count; ++k) {
      const int rank = resized ? int(k) : p.index;
      Opened o = open(model_shard_file(i, rank), p.device);
      reading(o.path, [&] { sharded_[i]->check(o.archive, meta.num_processes, rank); });
      if (k == 0) model_shards_path[i] = o.path;
      model_shards[i].push_back(std::move(o.archive));
    }
  }
  for (std::size_t i = 0; i < optimizers_.size(); ++i)
    optimizers.push_back(open_checked(indexed("optimizer", i), optimizers_[i]));
  for (std::size_t i = 0; i < schedulers_.size(); ++i)
    schedulers.push_back(open_checked(indexed("scheduler", i), schedulers_[i]));
  std::optional<Opened> scaler;
  if (scaler_) scaler = open_checked(scaler_file, *scaler_);
  std::vector<Opened> customs;
  std::vector<std::function<void()>> restore_custom;  // parsed and checked: restoring cannot fail on the data
  for (std::size_t i = 0; i < custom_.size(); ++i) {
    customs.push_back(open(custom_file(i), custom_[i].on_device ? std::optional(p.device) : std::nullopt));
    restore_custom.push_back(read_custom(custom_[i], i, customs.back().archive, customs.back().path));
  }
  // ZeRO partitions (optim/sharded.hpp): each process's own part of the optimizer state; at another number of
  // processes every saved part, re-cut for this many (each process reads them all).
  std::vector<std::vector<Opened>> partitions(partitions_.size());
  std::vector<std::vector<torch::serialize::InputArchive>> saved_parts(partitions_.size());
  for (std::size_t i = 0; i < partitions_.size(); ++i) {
    const std::int64_t count = resized ? meta.num_processes : 1;
    for (std::int64_t k = 0; k < count; ++k)
      partitions[i].push_back(open(partition_file(i, resized ? int(k) : p.index), p.device));
    if (!resized) {
      if (partitions_[i].own.check)
        reading(partitions[i][0].path, [&] { partitions_[i].own.check(partitions[i][0].archive); });
      continue;
    }
    for (auto& o : partitions[i]) saved_parts[i].push_back(std::move(o.archive));
    reading(partitions[i][0].path, [&] { partitions_[i].check_all(saved_parts[i]); });
  }
  // Rank 0's record: the loaders' global positions and the accumulation counter, for every process. This
  // process's own: its generators and gradients (a rank the saving job did not have takes rank 0's generators).
  const auto state_bytes = generator_bytes(at::detail::getDefaultCPUGenerator()).size();
  auto read_record = [&](Opened& o) {
    auto r = read_process_record(o.archive, o.path, state_bytes, meta.format_version);
    if (r.loaders.size() != loaders_.size())
      throw FileError(o.path, "holds " + std::to_string(r.loaders.size()) +
                                  " loader states, the checkpoint describes " + std::to_string(loaders_.size()));
    return r;
  };
  Opened lead_file = open(process_file(0), std::nullopt);
  const auto lead = read_record(lead_file);
  std::optional<Opened> own_file;
  if (p.index != 0 && p.index < meta.num_processes) own_file = open(process_file(p.index), std::nullopt);
  const auto record = own_file ? read_record(*own_file) : lead;
  Opened& proc = own_file ? *own_file : lead_file;
  accel::detail::require(!resized || !lead.local_gradients,
                         "accel::load_state: " + dir.string() + " was saved inside a gradient-accumulation window by " +
                             std::to_string(meta.num_processes) +
                             " process(es); its local gradients cannot be shared out "
                             "among " +
                             std::to_string(p.count) + ": resume it with " + std::to_string(meta.num_processes) +
                             " processes, or save at a step boundary (when sync_gradients() is true)");
  // The loaders' states are rank 0's: each of this loader's path, length and batch size (else a setting differs),
  // and each a state that a job of the saving size reaches (else the file is damaged).
  for (std::size_t i = 0; i < loaders_.size(); ++i) {
    const auto& state = lead.loaders[i];
    if (meta.format_version >= 3 && state.processes != meta.num_processes)
      throw FileError(lead_file.path, "damaged loader state " + std::to_string(i) + ": 'processes' is " +
                                          std::to_string(state.processes) + ", and " + meta_file +
                                          " says the checkpoint was written by " + std::to_string(meta.num_processes) +
                                          " (one of the two files is not this checkpoint's)");
    if (loaders_[i].mismatch)
      if (const auto what = loaders_[i].mismatch(state); !what.empty())
        throw InvalidArgument("accel::load_state: loader " + std::to_string(i) + " of " + lead_file.path + " " + what +
                              "; resume with the data and loader settings of the job that saved it");
    if (loaders_[i].unreachable)
      if (const auto what = loaders_[i].unreachable(state); !what.empty())
        throw FileError(lead_file.path, "damaged loader state " + std::to_string(i) + ": it " + what);
  }
  // This process's gradients of an accumulation window (none: the parameter's gradient is cleared), checked too.
  std::vector<std::vector<at::Tensor>> grads(models_.size());
  reading(proc.path, [&] {
    for (std::size_t m = 0; m < models_.size(); ++m)
      for (const auto& param : models_[m]->named_parameters()) {
        at::Tensor g;
        if (!resized && proc.archive.try_read(grad_key(m, param.key()), g)) {
          // A gradient kept in another dtype than its parameter's (`set_grad_dtype`: full sharding's mixed precision)
          // is compared with that dtype.
          const auto& v = param.value();
          const auto dtype = v.requires_grad() ? v.grad_dtype() : std::nullopt;
          const at::Tensor want = dtype && *dtype != v.scalar_type()
                                      ? at::empty(v.sizes(), v.options().dtype(*dtype).device(at::kMeta))
                                      : v;
          check_layout(proc.path, "the gradient of " + param.key(), g, "the parameter's", want);
        }
        grads[m].push_back(g);
      }
  });
  // Last of the checks (every file is whole and fits): the training settings that shape the trajectory; another
  // value is refused unless the caller allows it.
  if (const auto& saved = meta.settings; saved && !allow_changed_settings) {
    auto differ = [&](const char* name, const std::string& was, const std::string& is, const char* option) {
      if (was == is) return;
      throw InvalidArgument(
          "accel::load_state: " + meta_path + " was saved with " + name + " = " + was + ", this job has " + is +
          ": resuming would not continue the saved run's trajectory. Use the same Options::" + option +
          ", or pass accel::LoadOptions{.allow_changed_settings = true} to load_state to resume with " + is +
          " on purpose");
    };
    differ("mixed_precision", saved->mixed_precision, settings.mixed_precision, "mixed_precision");
    differ("gradient_accumulation_steps", std::to_string(saved->gradient_accumulation_steps),
           std::to_string(settings.gradient_accumulation_steps), "gradient_accumulation_steps");
  }
  // Every process has checked what it reads: a problem any of them found stops them all before anything is restored.
  if (const auto problem = agree(""); !problem.empty())
    throw InvalidArgument("accel::load_state: another process refused the checkpoint, so none restores it: " + problem);
  // Restoring: an archive of other keys or shapes than the object it is loaded into still names its file.
  for (std::size_t i = 0; i < models_.size(); ++i) {
    if (shard_files[i]) {
      reading(model_shards_path[i], [&] {
        if (resized)
          sharded_[i]->load_all(model_shards[i]);
        else
          sharded_[i]->load(model_shards[i].front());
      });
      continue;
    }
    std::optional<Whole> whole;  // a whole model.pt into a fully sharded model: loaded gathered, then cut
    if (sharded_[i]) whole.emplace(*sharded_[i]);
    reading(models[i]->path, [&] { models_[i]->load(models[i]->archive); });
    if (whole) whole->keep = true;
  }
  for (std::size_t i = 0; i < optimizers_.size(); ++i)
    reading(optimizers[i].path, [&] { optimizers_[i].load(optimizers[i].archive); });
  for (std::size_t i = 0; i < schedulers_.size(); ++i)
    reading(schedulers[i].path, [&] { schedulers_[i].load(schedulers[i].archive); });
  if (scaler) reading(scaler->path, [&] { scaler_->load(scaler->archive); });
  // After the models: a partition puts the loaded parameters back into its flat buffer.
  for (std::size_t i = 0; i < partitions_.size(); ++i)
    reading(partitions[i][0].path, [&] {
      if (resized)
        partitions_[i].load_all(saved_parts[i]);
      else
        partitions_[i].own.load(partitions[i][0].archive);
    });
  for (auto& restore : restore_custom) restore();
  reading(proc.path, [&] {
    set_generator_bytes(at::detail::getDefaultCPUGenerator(), record.rng_cpu);
    if (p.device.is_cuda() && !record.rng_device.empty())
      set_generator_bytes(at::globalContext().defaultGenerator(p.device), record.rng_device);
    for (std::size_t m = 0; m < models_.size(); ++m) {
      std::size_t i = 0;
      for (auto& param : models_[m]->named_parameters()) {
        const at::Tensor& g = grads[m][i++];
        param.value().mutable_grad() = g.defined() ? g.to(param.value().device()) : at::Tensor();
      }
    }
    for (std::size_t i = 0; i < loaders_.size(); ++i) loaders_[i].load(lead.loaders[i]);
  });
  if (trackers) *trackers = meta.trackers;
  p.barrier();
  return lead.step;
}

}  // namespace accel::checkpoint
