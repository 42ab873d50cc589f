#pragma once
//! \file
//! `Accelerator`'s checkpoints, trackers and preemption (accelerator.hpp): save_state, load_state,
//! latest_checkpoint, register_for_checkpointing, register_save_state_pre_hook, save_model, init_trackers, log,
//! end_training, and the save at a step boundary under `Options::preemption`. Included by accelerator.hpp.

#include <accel/accelerator.hpp>
#include <accel/checkpoint/custom.hpp>
#include <accel/core/generator_state.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace accel {

template <class... Policies>
void Accelerator<Policies...>::save_state(const std::filesystem::path& dir) {
  for (const auto& hook : save_hooks_) hook(dir);
  checkpointer_.save(dir, checkpoint_process(), accumulation_.step(), /*local_gradients=*/!sync_gradients(), settings(),
                     trackers_.position());
}

template <class... Policies>
checkpoint::Settings Accelerator<Policies...>::settings() const {
  return {.mixed_precision = opt_.mixed_precision == Precision::fp16   ? "fp16"
                             : opt_.mixed_precision == Precision::bf16 ? "bf16"
                                                                       : "no",
          .gradient_accumulation_steps = opt_.gradient_accumulation_steps};
}

template <class... Policies>
std::filesystem::path Accelerator<Policies...>::save_state() {
  auto& project = opt_.project_config;
  agree_on_main("save_state", [&] { (void)checkpoint::next_checkpoint_dir(project); });
  const auto dir = checkpoint::numbered_dir(project, project.iteration);
  save_state(dir);
  if (is_main_process())
    for (const auto& problem : checkpoint::prune_checkpoints(project, project.iteration))
      std::fprintf(stderr, "accel: warning: total_limit: %s\n", problem.c_str());
  ++project.iteration;
  return dir;
}

template <class... Policies>
void Accelerator<Policies...>::load_state(const std::filesystem::path& dir, const LoadOptions& options) {
  restore(dir, opt_.project_config.automatic_checkpoint_naming ? latest_checkpoint_number() : std::nullopt, options);
}

template <class... Policies>
std::filesystem::path Accelerator<Policies...>::load_state(const LoadOptions& options) {
  agree_on_main("load_state", [&] { (void)checkpoint::checkpoint_to_resume(opt_.project_config); });
  const auto latest = latest_checkpoint_number();  // there is one: the main process found it
  const auto dir = checkpoint::numbered_dir(opt_.project_config, *latest);
  restore(dir, latest, options);
  return dir;
}

template <class... Policies>
std::optional<std::filesystem::path> Accelerator<Policies...>::latest_checkpoint() const {
  const auto n = latest_checkpoint_number();
  if (!n) return std::nullopt;
  return checkpoint::numbered_dir(opt_.project_config, *n);
}

template <class... Policies>
template <class... Objects>
void Accelerator<Policies...>::register_for_checkpointing(Objects&&... objects) {
  static_assert(sizeof...(Objects) > 0, "accel::Accelerator::register_for_checkpointing: pass at least one object");
  (register_one(std::forward<Objects>(objects)), ...);
}

template <class... Policies>
void Accelerator<Policies...>::register_save_state_pre_hook(std::function<void(const std::filesystem::path&)> hook) {
  detail::require(bool(hook), "accel::Accelerator::register_save_state_pre_hook: an empty function");
  save_hooks_.push_back(std::move(hook));
}

template <class... Policies>
template <class M>
requires ModuleHandle<M> || is_prepared_model<M>
void Accelerator<Policies...>::save_model(const M& model, const std::filesystem::path& dir,
                                          const checkpoint::SaveModelOptions& options) {
  std::exception_ptr failure;
  std::string message;
  const auto whole = gather_parameters(model);  // full sharding: written whole (collective)
  if (is_main_process()) {
    try {
      checkpoint::save_model(*module_of(unwrap_model(model)), dir, options);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      message = e.what();
    }
  }
  // not a step call: saving a model is every rank's call between steps, never repeated
  message = broadcast_object(comm(), message);  // the others' barrier, and the main process's outcome
  if (failure) std::rethrow_exception(failure);
  if (!message.empty()) throw Error(message + " (raised on the main process)");
}

template <class... Policies>
void Accelerator<Policies...>::init_trackers(const std::string& project_name, const tracking::Values& config) {
  detail::require(!project_name.empty(), "accel::Accelerator::init_trackers: the project name is empty");
  // Every process makes the run (with writers on the main process alone), so that each checks the names, counts
  // the log calls and continues from the same position: the checkpoint's, if load_state restored one.
  const tracking::Start start{.continuing = resumed_, .from = resumed_ ? trackers_.position() : std::nullopt};
  trackers_ = tracking::Trackers(is_main_process() ? opt_.log_with : std::vector<tracking::Tracker>{},
                                 logging_dir() / project_name, config, start);
  trackers_started_ = true;
}

template <class... Policies>
void Accelerator<Policies...>::log(const tracking::Values& values, std::optional<std::int64_t> step) {
  detail::require(trackers_started_, "accel::Accelerator::log: no run is being tracked; call init_trackers first");
  trackers_.log(values, step);  // written on the main process, counted on every one
}

template <class... Policies>
void Accelerator<Policies...>::end_training() {
  stop_tracking();
  wait_for_everyone();
}

template <class... Policies>
std::filesystem::path Accelerator<Policies...>::logging_dir() const {
  if (!opt_.logging_dir.empty()) return opt_.logging_dir;
  const auto& p = opt_.project_config;
  return p.logging_dir.empty() ? p.project_dir : p.logging_dir;
}

template <class... Policies>
checkpoint::Checkpointer::Process Accelerator<Policies...>::checkpoint_process() const {
  return {process_index(), num_processes(), device(), [this] { wait_for_everyone(); },
          [this](const std::string& problem) {
            // not a step call: load_state's agreement, between steps
            const auto problems = gather_object(comm(), problem);
            for (std::size_t r = 0; r < problems.size(); ++r)
              if (!problems[r].empty()) return "rank " + std::to_string(r) + ": " + problems[r];
            return std::string();
          }};
}

template <class... Policies>
void Accelerator<Policies...>::restore(const std::filesystem::path& dir, std::optional<std::int64_t> latest,
                                       const LoadOptions& options) {
  std::optional<tracking::Position> trackers;
  accumulation_.set_step(
      checkpointer_.load(dir, checkpoint_process(), settings(), options.allow_changed_settings, &trackers));
  resumed_ = true;
  if (!trackers_started_) trackers_ = tracking::Trackers::at(trackers);  // init_trackers goes on from there
  for (const auto& d : ddps_) d->forget_window();  // the checkpoint's weights: not a step outside accel
  replicas_agreed_ = training_steps_;
  if (latest) opt_.project_config.iteration = std::max(opt_.project_config.iteration, *latest + 1);
}

template <class... Policies>
void Accelerator<Policies...>::stop_tracking() {
  trackers_.finish();
  trackers_started_ = false;
}

template <class... Policies>
template <class Check>
void Accelerator<Policies...>::agree_on_main(const char* what, Check&& check) const {
  std::string problem;
  if (is_main_process()) try {
      check();
    } catch (const std::exception& e) {
      problem = e.what();
      if (problem.empty()) problem = std::string("accel::Accelerator::") + what + " failed";
    }
  problem = broadcast_object(comm(), problem);  // not a step call: a check of the main process, between steps
  if (!problem.empty()) throw InvalidArgument(problem);
}

template <class... Policies>
std::optional<std::int64_t> Accelerator<Policies...>::latest_checkpoint_number() const {
  std::int64_t n = -1;
  if (is_main_process())
    if (const auto latest = checkpoint::latest_checkpoint(opt_.project_config)) n = latest->number;
  n = broadcast_object(comm(), n);  // not a step call: a query between steps
  return n < 0 ? std::nullopt : std::optional<std::int64_t>(n);
}

template <class... Policies>
template <class T>
void Accelerator<Policies...>::register_one(T&& object) {
  using U = std::remove_cvref_t<T>;
  if constexpr (ModuleHandle<U>) {
    auto m = module_of(object);
    auto c = checkpoint::Custom::of(*m, m);
    c.type = m->name();
    checkpointer_.add_custom(std::move(c));
  } else if constexpr (!std::is_void_v<detail::shared_t<U>>) {
    using V = detail::shared_t<U>;
    static_assert(checkpoint::Checkpointable<V>,
                  "accel::Accelerator::register_for_checkpointing: the object has neither save(OutputArchive&) "
                  "const / load(InputArchive&), nor state_dict() / load_state_dict() of a serialisable state, "
                  "nor is it serialisable itself (give a struct an accel_fields overload)");
    if constexpr (checkpoint::Checkpointable<V>) {
      detail::require(object != nullptr, "accel::Accelerator::register_for_checkpointing: a null std::shared_ptr");
      checkpointer_.add_custom(checkpoint::Custom::of(*object, object));
    }
  } else {
    static_assert(
        std::is_lvalue_reference_v<T> && !std::is_const_v<std::remove_reference_t<T>>,
        "accel::Accelerator::register_for_checkpointing: pass a non-const lvalue (it is restored in place and "
        "must outlive the job's save_state / load_state) or a std::shared_ptr");
    static_assert(checkpoint::Checkpointable<U>,
                  "accel::Accelerator::register_for_checkpointing: the object has neither save(OutputArchive&) "
                  "const / load(InputArchive&), nor state_dict() / load_state_dict() of a serialisable state, "
                  "nor is it serialisable itself (give a struct an accel_fields overload)");
    if constexpr (checkpoint::Checkpointable<U> && std::is_lvalue_reference_v<T>)
      checkpointer_.add_custom(checkpoint::Custom::of(object));
  }
}

template <class... Policies>
void Accelerator<Policies...>::bind_boundary_hook() {
  if ((signals_.active() || opt_.check_replicas_every > 0) && GradientState::instance().step_boundary_owner() != this)
    GradientState::instance().set_step_boundary_hook(this, [this] { at_step_boundary(); });
}

template <class... Policies>
void Accelerator<Policies...>::at_step_boundary() {
  if (opt_.check_replicas_every > 0) {  // Note [Replica check]
    // Counted here rather than by the prepared optimizers: an optimizer accel never saw steps too.
    if (sync_gradients() && backwards_ != backwards_at_boundary_) ++training_steps_;
    backwards_at_boundary_ = backwards_;
    if (training_steps_ >= replicas_agreed_ + std::uint64_t(opt_.check_replicas_every)) {
      // not a step call: at a step boundary, which runs only when every rank held the step (never repeated)
      check_replicas(comm(), replica_parameters(), training_steps_, replicas_agreed_);
      replicas_agreed_ = training_steps_;
    }
  }
  if (!signals_.active()) return;
  std::uint64_t steps = 0;
  for (const auto& o : optimizers_) steps += o.record->steps;
  if (steps < boundary_steps_ + std::uint64_t(opt_.preemption.check_every)) return;  // not a step boundary, or not yet
  boundary_steps_ = steps;
  int sig = detail::SignalWatch::received();
  // not a step call: at a step boundary, which runs only when every rank held the step (never repeated)
  if (num_processes() > 1) sig = int(reduce_flag(sig, Reduction::max));
  if (sig == 0) return;
  print("accel: signal ", sig, " received; saving a checkpoint at this step boundary, then stopping");
  const auto dir = save_state();
  stop_tracking();
  detail::SignalWatch::clear();
  print("accel: checkpoint saved to ", dir.string(), "; resume with load_state()");
  if (opt_.preemption.exit) {
    std::fflush(nullptr);
    std::_Exit(opt_.preemption.exit_code);  // no destructors: the loader's workers and the engine's threads still run
  }
  throw Preempted(sig, dir);
}

}  // namespace accel
