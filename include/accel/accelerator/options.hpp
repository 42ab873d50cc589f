#pragma once
//! \file
//! `Precision` and `Options`: the run-time settings of an `Accelerator` (accelerator.hpp), what never changes a
//! type; and `detail::shared_t`, which the definitions of its members share. Included by accelerator.hpp.

#include <accel/checkpoint/project.hpp>
#include <accel/comm/collective_id.hpp>
#include <accel/model/distributed_module.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/state/launch_env.hpp>
#include <accel/state/preemption.hpp>
#include <accel/tracking/tracker.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

namespace accel {

using checkpoint::ProjectConfiguration;

//! Accelerate's `mixed_precision`.
enum class Precision {
  no,    //!< fp32 everywhere
  fp16,  //!< fp16 autocast and a GradScaler; needs a GPU (as in Accelerate)
  bf16,  //!< bf16 autocast, on the CPU or a GPU; no scaling needed
};

//! The run-time settings of an `Accelerator`: what never changes a type.
struct Options {
  std::optional<std::uint64_t> seed;          //!< `set_seed` at construction (unset: leave the generators alone)
  bool device_specific_seed = false;          //!< add the process index to the seed
  int gradient_accumulation_steps = 1;        //!< Accelerate's `gradient_accumulation_steps`
  bool sync_with_dataloader = true;           //!< sync (and reset the counter) at the end of every loader
  bool sync_each_batch = false;               //!< all-reduce on every batch, step every `gradient_accumulation_steps`
  bool step_scheduler_with_optimizer = true;  //!< false: the scheduler steps on every call
  bool scheduler_steps_once = false;          //!< step schedulers once per optimizer step, not once per process
  Precision mixed_precision = Precision::no;  //!< Accelerate's `mixed_precision`: no, bf16, fp16
  GradScalerOptions scaler{};                 //!< the loss scaling under `Precision::fp16`
  std::int64_t bucket_bytes = 25 * 1024 * 1024;  //!< gradient all-reduce bucket size
  bool find_unused_parameters = false;           //!< parameters without a gradient contribute zeros instead of an error
  bool broadcast_buffers = true;                 //!< DDP's: rank 0's buffers before a forward, when DDP broadcasts them
  CommHook comm_hook = CommHook::none;  //!< Accelerate's comm_hook: gradient buckets compressed to fp16 or bf16
  ShardingOptions sharding{};           //!< under accel::shard::parameters: the units, and FSDP's reshard_after_forward
  comm::CommOptions comm{};             //!< collective and rendezvous timeouts
  LaunchOverrides launch{};             //!< explicit rank / world size / address, winning over the environment
  std::vector<tracking::Tracker> log_with{};  //!< Accelerate's log_with: the trackers `init_trackers` starts
  std::filesystem::path logging_dir{};        //!< trackers write into `<logging_dir>/<project_name>/` (empty: the
                                              //!< project's logging_dir, else its project_dir)
  ProjectConfiguration project_config{};  //!< checkpoint folder, automatic naming, total_limit (checkpoint/project.hpp)
  PreemptionOptions preemption{};         //!< save and stop on SIGTERM / SIGUSR1 (state/preemption.hpp)
  //! Compare a fingerprint of every prepared model's parameters across the processes every this many optimizer
  //! steps, at a step boundary, and stop every process with `ReplicaDivergence` naming the first parameter that
  //! differs (0: never; Note [Replica check] in model/replicas.hpp). About one all-gather of 16 bytes per parameter.
  std::int64_t check_replicas_every = 0;
};

//! How `Accelerator::load_state` treats a checkpoint saved under other training settings.
struct LoadOptions {
  //! Resume a checkpoint saved under another `Options::mixed_precision` or `gradient_accumulation_steps` on
  //! purpose (the trajectory then differs from the saving job's); by default that is an error naming both values.
  bool allow_changed_settings = false;
};

namespace detail {
template <class T>
struct shared_of {
  using type = void;
};
template <class T>
struct shared_of<std::shared_ptr<T>> {
  using type = T;
};
template <class T>
using shared_t = typename shared_of<std::remove_cvref_t<T>>::type;
}  // namespace detail

}  // namespace accel
