#pragma once
//! \file
//! `Checkpointer`: what a job registers for checkpointing, in `prepare` order, and how it is written and read
//! (the directory layout is format.hpp). `Accelerator::save_state` and `load_state` are this class.
//!
//! Saving: every process calls `save`; the main process writes the shared files (models, optimizers, schedulers,
//! scaler, custom objects), every process its own record, all into `<dir>.partial`, which the main process swaps in
//! whole once every process has written its part and the main process has listed every file in the manifest
//! (manifest.hpp). Loading verifies the manifest, reads every file this process needs through it (size and checksum),
//! checks what the checkpoint holds against what this job prepared (format, processes, counts, mixed precision) and
//! opens every archive before anything is restored; a damaged file is one `FileError` naming it.
//!
//! Another number of processes (README, "Resuming at another world size"): the replicated files load as they are;
//! every process takes the loaders' states (global positions) and the accumulation counter from rank 0's record;
//! the process generators come from the process's own record, and a rank the saving job did not have takes rank
//! 0's. A checkpoint saved inside an accumulation window (local gradients) resumes only with the same number.

#include <accel/checkpoint/archive.hpp>
#include <accel/checkpoint/custom.hpp>
#include <accel/checkpoint/format.hpp>
#include <accel/checkpoint/manifest.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/core/generator_state.hpp>
#include <accel/core/serialize.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/model/unit_sharder.hpp>
#include <accel/tracking/tracker.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc)

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::checkpoint {

//! What a job registers for checkpointing, in `prepare` order, and how a checkpoint is written and read (see the file's
//! comment); `Accelerator::save_state` and `load_state` are this class.
class Checkpointer {
 public:
  //! An object that saves into and loads from one archive (an optimizer, a scheduler, the scaler).
  struct Saveable {
    std::function<void(torch::serialize::OutputArchive&)> save;  //!< writes the object into an archive
    std::function<void(torch::serialize::InputArchive&)> load;   //!< restores it from one
    std::function<void(torch::serialize::InputArchive&)>
        check{};  //!< optional: refuses an archive before anything is restored
  };
  //! A ZeRO partition (optim/sharded.hpp): this process's own archive, or at another number of processes every
  //! saved process's archives, re-cut (`check_all` refuses them before anything is restored, `load_all` restores).
  struct Partition {
    Saveable own;  //!< this process's own partition
    //!@{
    //! At another number of processes: refuse the saved partitions, or restore this process's from them.
    std::function<void(std::vector<torch::serialize::InputArchive>&)> check_all, load_all;
    //!@}
  };
  //! A prepared loader's position; `mismatch` says what differs between a saved state's loader and this one ("" if
  //! nothing does), `unreachable` what makes the state one that no job of this loader reaches (damage).
  struct Loader {
    std::function<data::LoaderState()> save;                                //!< the loader's `state_dict()`
    std::function<void(const data::LoaderState&)> load;                     //!< its `load_state_dict()`
    std::function<std::string(const data::LoaderState&)> mismatch = {};     //!< see above ("" if nothing differs)
    std::function<std::string(const data::LoaderState&)> unreachable = {};  //!< see above ("" if reachable)
  };
  //! The process that writes or reads: its rank, the job's size, its device, and a barrier over every process.
  struct Process {
    int index = 0;                                //!< this process's rank
    int count = 1;                                //!< the job's processes
    c10::Device device = c10::Device(c10::kCPU);  //!< where tensors are restored
    std::function<void()> barrier;                //!< waits for every process
    //! Loading: every process passes what it found wrong with the checkpoint ("" if nothing) and receives the
    //! first problem any process found ("" if none), so that either every process restores or none does. Unset:
    //! this process alone decides.
    std::function<std::string(const std::string&)> agree = {};
  };

  //! A fully sharded model (`shard::parameters`, model/unit_sharder.hpp): how its state is written and read.
  //! Which file a checkpoint holds decides how it is loaded: each process's shards, read without gathering (at
  //! another number of processes, every saved process's shards, re-cut), or a whole `model.pt` (an unsharded job's,
  //! or one saved with `write_shards` false), loaded into the gathered model and put back into the shards.
  struct ShardedModel {
    //! `save` writes each process's shards (`model_<i>_rank<r>.pt`, StateDictType::sharded); false: the whole
    //! model, gathered, into `model.pt` (StateDictType::full).
    bool write_shards = true;
    std::function<void(torch::serialize::OutputArchive&)> save;  //!< writes this process's shards
    //! Refuses an archive that is not rank `rank`'s shards among `processes` of this model, before anything is read.
    std::function<void(torch::serialize::InputArchive&, std::int64_t processes, std::int64_t rank)> check;
    std::function<void(torch::serialize::InputArchive&)> load;  //!< restores this process's shards (same size)
    //! At another number of processes: restores this process's shards from every saved process's.
    std::function<void(std::vector<torch::serialize::InputArchive>&)> load_all;
    //! Gathers the whole model on every process (collective); the function it returns frees it again, first
    //! putting what was loaded into the parameters back into the shards when given true.
    std::function<std::function<void(bool)>()> gather;
  };

  //! Registers a model (`model.pt`, `model_1.pt`, ...), in prepare order; `sharded`: a fully sharded one.
  void add_model(std::shared_ptr<torch::nn::Module> m, std::optional<ShardedModel> sharded = std::nullopt) {
    models_.push_back(std::move(m));
    sharded_.push_back(std::move(sharded));
  }
  //! Registers an optimizer (`optimizer.pt`, ...), in prepare order.
  void add_optimizer(Saveable s) { optimizers_.push_back(std::move(s)); }
  //! A state every process saves and loads its own part of (a ZeRO partition of optimizer `i`'s state), into
  //! `zero_<i>_rank<r>.pt`.
  void add_partition(Partition s) { partitions_.push_back(std::move(s)); }
  //! Registers a scheduler (`scheduler.pt`, ...), in prepare order.
  void add_scheduler(Saveable s) { schedulers_.push_back(std::move(s)); }
  //! Registers a prepared loader (its state goes into every process's record).
  void add_loader(Loader l) { loaders_.push_back(std::move(l)); }
  //! Registers the GradScaler (`scaler.pt`).
  void set_scaler(Saveable s) { scaler_ = std::move(s); }
  //! Registers a custom object (`custom_checkpoint_<i>.pt`, `register_for_checkpointing`).
  void add_custom(Custom c) { custom_.push_back(std::move(c)); }
  //! The registered models.
  [[nodiscard]] const std::vector<std::shared_ptr<torch::nn::Module>>& models() const noexcept { return models_; }

  //! Writes the checkpoint: `step` is the accumulation counter; `local_gradients`: saved inside an accumulation
  //! window, so each process's gradients gathered so far are saved too; `settings`: the job's training settings;
  //! `trackers`: the trackers' position (none: not recorded).
  ACCEL_DECL void save(const std::filesystem::path& dir, const Process& p, std::int64_t step, bool local_gradients,
                       const Settings& settings = {},
                       const std::optional<tracking::Position>& trackers = std::nullopt) const;

  //! Restores `dir` into the registered objects (in registration order); returns the accumulation counter. A
  //! checkpoint that records other training settings than `settings` is refused unless `allow_changed_settings`.
  //! `trackers`, if given, receives the trackers' position the checkpoint recorded (none: not recorded). Every
  //! file is checked before anything is restored, on every process (`Process::agree`): a checkpoint one process
  //! refuses is restored by none.
  std::int64_t load(const std::filesystem::path& given, const Process& p, const Settings& settings = {},
                    bool allow_changed_settings = false, std::optional<tracking::Position>* trackers = nullptr) {
    bool agreed = false;
    auto agree = [&](const std::string& problem) {
      agreed = true;
      return p.agree ? p.agree(problem) : problem;
    };
    try {
      return load_checked(given, p, settings, allow_changed_settings, trackers, agree);
    } catch (const std::exception& e) {
      if (!agreed) (void)agree(e.what());  // refused here: the other processes learn it before restoring
      throw;
    }
  }

 private:
  // `load`'s body: `agree` is called once every check passed, before anything is restored.
  ACCEL_DECL std::int64_t load_checked(const std::filesystem::path& given, const Process& p, const Settings& settings,
                                       bool allow_changed_settings, std::optional<tracking::Position>* trackers,
                                       const std::function<std::string(const std::string&)>& agree);
  // Puts the complete checkpoint `tmp` at `dir` so that a crash at any moment leaves `dir` whole (the old one or
  // the new one): an atomic exchange where the file system has one (Linux renameat2), else two renames, after
  // which a crash between them leaves the old checkpoint at `<dir>.old`, where `load` looks too.
  static void swap_in(const std::filesystem::path& tmp, const std::filesystem::path& dir) {
    if (std::filesystem::exists(dir)) {
#ifdef RENAME_EXCHANGE
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        std::filesystem::remove_all(tmp);  // now the old checkpoint
        return;
      }
#endif
      const auto old = std::filesystem::path(dir.string() + ".old");
      std::filesystem::remove_all(old);
      std::filesystem::rename(dir, old);
      std::filesystem::rename(tmp, dir);
      std::filesystem::remove_all(old);
      return;
    }
    std::filesystem::rename(tmp, dir);
  }
  static std::string partition_file(std::size_t i, int rank) {
    return "zero_" + std::to_string(i) + "_rank" + std::to_string(rank) + ".pt";
  }
  static std::string model_shard_file(std::size_t i, int rank) {
    return "model_" + std::to_string(i) + "_rank" + std::to_string(rank) + ".pt";
  }
  // A fully sharded model gathered whole while it lives (`ShardedModel::gather`); `keep`: what was loaded goes
  // back into the shards at its end.
  struct Whole {
    std::function<void(bool)> release;
    bool keep = false;
    explicit Whole(const ShardedModel& m) : release(m.gather()) {}
    Whole(const Whole&) = delete;
    Whole& operator=(const Whole&) = delete;
    ~Whole() {
      if (release) release(keep);
    }
  };
  static std::string grad_key(std::size_t model, const std::string& name) {
    return "grad_" + std::to_string(model) + "_" + name;
  }
  template <class F>
  static void save_one(F&& save, const std::filesystem::path& path) {
    torch::serialize::OutputArchive a;
    save(a);
    a.save_to(path.string());
  }
  static void expect_count(std::int64_t saved, const std::filesystem::path& dir, const char* what, std::size_t have,
                           const char* done = "prepared", const char* fix = "prepare the same objects") {
    accel::detail::require(saved == std::int64_t(have), "accel::load_state: " + (dir / meta_file).string() + " holds " +
                                                            std::to_string(saved) + " " + what + ", this job " + done +
                                                            " " + std::to_string(have) + "; " + fix +
                                                            ", in the same order, as the job that saved it");
  }

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<std::optional<ShardedModel>> sharded_;  // per model: how a fully sharded one is written and read
  std::vector<Saveable> optimizers_, schedulers_;
  std::vector<Partition> partitions_;
  std::vector<Loader> loaders_;
  std::optional<Saveable> scaler_;
  std::vector<Custom> custom_;
};

//! How a checkpoint writes and reads the fully sharded model `s` shards (`Checkpointer::add_model`): its shards, or the
//! whole model as `ShardingOptions::state_dict_type` says.
inline Checkpointer::ShardedModel sharded_model(const std::shared_ptr<UnitSharder>& s) {
  return {.write_shards = s->options().state_dict_type == StateDictType::sharded,
          .save = [s](auto& a) { s->save_shards(a); },
          .check = [s](auto& a, std::int64_t processes, std::int64_t rank) { s->check_shards(a, processes, rank); },
          .load = [s](auto& a) { s->load_shards(a); },
          .load_all = [s](auto& parts) { s->load_resharded(parts); },
          .gather =
              [s] {
                s->gather_all();
                return std::function<void(bool)>([s](bool write_back) { s->release_all(write_back); });
              }};
}

//! What the checkpoint in `dir` holds (its `accel_checkpoint.pt`, checked against the manifest): the number of
//! processes that wrote it, the counts of prepared objects.
inline Meta describe(const std::filesystem::path& dir) {
  const auto manifest = Manifest::read(dir);
  return read_meta(manifest.read(dir, meta_file), (dir / meta_file).string());
}

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/checkpointer.ipp>
#endif
