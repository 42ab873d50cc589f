#pragma once
//! \file
//! `AcceleratedOptimizer` and `AcceleratedScheduler`: the user's LibTorch optimizer and scheduler, stepping only
//! when gradients are synchronised (Accelerate's `optimizer.py`, `scheduler.py`).
//!
//! | Accelerate                          | accel                                                        |
//! |-------------------------------------|--------------------------------------------------------------|
//! | `AcceleratedOptimizer.step/zero_grad` | no-ops unless `GradientState::sync_gradients()`            |
//! | `step` with a GradScaler            | `scaler.step(optimizer)` then `scaler.update()`; `step_was_skipped` when
//! inf/NaN was found | | `AcceleratedScheduler.step`         | N steps per real optimizer step under
//! `batches::per_process` (Accelerate's rule: the schedule is sized for the un-sharded loader), 1 under
//! `batches::split`, `always_once` to step once; none after a skipped step | | `AcceleratedScheduler.step(*args)`  |
//! `step(metric)` for a scheduler that takes one (`ReduceLROnPlateau`), the same number of times | | the `total_steps`
//! guard             | a scheduler with `total_steps()` (`OneCycleLR`) is not stepped past it by the N steps | |
//! `state_dict` / `load_state_dict`    | `save` / `load`: the scheduler's own `save`/`load` where it has them
//! (optim/schedulers.hpp), else LibTorch's step count |
//!
//! Both are handles: copies share one wrapper (the `Accelerator` keeps one for checkpoints, the loop another).

#include <accel/error.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/optim/sharded.hpp>
#include <accel/optim/state_check.hpp>
#include <accel/state/gradient_state.hpp>

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/archive.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accel {

//! What a scheduler needs to know about an optimizer's last step (`AcceleratedOptimizer::record()`).
struct StepRecord {
  bool skipped = false;     //!< the last step was skipped (inf/NaN)
  std::uint64_t steps = 0;  //!< synchronising steps taken (skipped ones included): the step boundaries so far
};

namespace detail {

//! The step counter LibTorch keeps protected in `LRScheduler` (its whole state besides the optimizer's lrs).
struct SchedulerAccess : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& s) { return s.*(&SchedulerAccess::step_count_); }
};
}  // namespace detail

//! A LibTorch optimizer (derived from `torch::optim::Optimizer`).
template <class O>
concept TorchOptimizer = std::derived_from<O, torch::optim::Optimizer>;
//! A LibTorch learning-rate scheduler (derived from `torch::optim::LRScheduler`).
template <class S>
concept TorchScheduler = std::derived_from<S, torch::optim::LRScheduler>;
//! A scheduler that saves its whole state into an archive and loads it back (optim/schedulers.hpp).
template <class S>
concept SavesState = requires(const S& s, S& m, torch::serialize::OutputArchive& o, torch::serialize::InputArchive& i) {
  s.save(o);
  m.load(i);
};

// [accelerate:optimizer.py AcceleratedOptimizer]
//! The user's optimizer, prepared (Accelerate's `AcceleratedOptimizer`): `step` and `zero_grad` act only when
//! `GradientState::sync_gradients()` is true, through the GradScaler under fp16 and through the ZeRO partition under
//! `shard::optimizer` / `shard::gradients`. A handle: copies share one wrapper.
template <TorchOptimizer Optimizer>
class AcceleratedOptimizer {
  struct Shared {
    std::shared_ptr<Optimizer> opt;
    std::shared_ptr<GradScaler> scaler;
    std::shared_ptr<StepRecord> record = std::make_shared<StepRecord>();
    std::shared_ptr<ShardedOptimizer> sharded;  // ZeRO stage 1: steps this rank's partition instead of `opt`
  };

 public:
  //! Wraps `optimizer`, stepping through `scaler` when there is one (fp16).
  explicit AcceleratedOptimizer(std::shared_ptr<Optimizer> optimizer, std::shared_ptr<GradScaler> scaler = nullptr)
      : s_(std::make_shared<Shared>(Shared{std::move(optimizer), std::move(scaler)})) {}

  //! Steps the inner optimizer when this step synchronises gradients; otherwise nothing. With a scaler: the
  //! step is skipped when any gradient is inf/NaN (on any process), and the scale is updated.
  void step() {
    GradientState::joined(  // a rank out of batches steps too, on the others' gradients (Note [Joined steps])
        GradientState::CallKind::local,
        [&] {
          if (!GradientState::instance().sync_gradients()) return;
          ++s_->record->steps;
          if (s_->scaler) {
            s_->record->skipped = s_->sharded
                                      ? !s_->scaler->step(s_->sharded->gradient_holder(), [&] { s_->sharded->step(); })
                                      : !s_->scaler->step(*s_->opt);
            s_->scaler->update();
          } else {
            s_->record->skipped = false;
            if (s_->sharded)
              s_->sharded->step();
            else
              s_->opt->step();
          }
        },
        [&] { return [self = *this]() mutable { self.step(); }; });
  }
  //! Clears the gradients when this step synchronises (`set_to_none` defaults to true, as in Accelerate).
  void zero_grad(bool set_to_none = true) {
    GradientState::joined(
        GradientState::CallKind::local,
        [&] {
          if (!GradientState::instance().sync_gradients()) return;
          s_->opt->zero_grad(set_to_none);
          if (s_->sharded) s_->sharded->zero_grad();
        },
        [&] { return [self = *this, set_to_none]() mutable { self.zero_grad(set_to_none); }; });
  }
  //! Whether the last synchronising step was skipped (inf/NaN gradients under fp16 scaling).
  [[nodiscard]] bool step_was_skipped() const noexcept { return s_->record->skipped; }

  //! The user's optimizer.
  [[nodiscard]] Optimizer& inner() const noexcept { return *s_->opt; }
  //! The user's optimizer's members.
  [[nodiscard]] Optimizer* operator->() const noexcept { return s_->opt.get(); }
  //! The user's optimizer, shared.
  [[nodiscard]] const std::shared_ptr<Optimizer>& shared() const noexcept { return s_->opt; }
  //! Its last step, for the schedulers it holds back.
  [[nodiscard]] std::shared_ptr<const StepRecord> record() const noexcept { return s_->record; }

  //! ZeRO stage 1: steps go to `sharded`, which holds this rank's partition of the state (`Accelerator::prepare`).
  void set_sharded(std::shared_ptr<ShardedOptimizer> sharded) { s_->sharded = std::move(sharded); }
  //! The ZeRO partition (nullptr: not sharded).
  [[nodiscard]] const std::shared_ptr<ShardedOptimizer>& sharded() const noexcept { return s_->sharded; }

  //! The inner optimizer's state (parameter groups with their options, and per-parameter buffers). Sharded: the
  //! user's optimizer, which holds the groups and their options but no state (each rank's partition of the
  //! state is saved apart: `ShardedOptimizer::save`), marked so that an unsharded job refuses it.
  void save(torch::serialize::OutputArchive& a) const {
    s_->opt->save(a);
    if (s_->sharded) a.write("zero_sharded", c10::IValue(std::int64_t(1)));
  }
  //! Restores what `save` wrote; a state `check` refuses changes nothing.
  void load(torch::serialize::InputArchive& a) { load_checked(a, /*keep=*/true); }
  //! Refuses (`InvalidArgument` naming the group, the parameter and the field) a saved state this optimizer could
  //! not have reached (Note [An optimizer's state from elsewhere] in optim/state_check.hpp), changing nothing.
  void check(torch::serialize::InputArchive& a) const { load_checked(a, /*keep=*/false); }

 private:
  // Loads `a` and checks what the optimizer then holds (`load_and_check`), keeping it only if the check passed and
  // `keep`.
  void load_checked(torch::serialize::InputArchive& a, bool keep) const {
    c10::IValue marked;
    const bool sharded = a.try_read("zero_sharded", marked);
    detail::require(
        sharded == bool(s_->sharded),
        sharded ? "accel::load_state: the checkpoint's optimizer was sharded (accel::shard::optimizer or "
                  "accel::shard::gradients) "
                  "and this job's is not; resume with either and the same number of processes"
                : "accel::load_state: the checkpoint's optimizer was not sharded and this job's is "
                  "(accel::shard::optimizer or accel::shard::gradients); resume with the configuration that saved it");
    const auto what = load_and_check(*s_->opt, a, keep);
    if (!what.empty()) throw InvalidArgument("optimizer state: " + what);
  }
  std::shared_ptr<Shared> s_;
};

// ---- the length of a schedule ------------------------------------------------------------------------------

//! The number of times a prepared scheduler steps over `epochs` passes of `loader` (a prepared loader, or its
//! number of batches per process and epoch): per epoch, ceil(batches / accumulation_steps) optimizer steps (the last
//! accumulation of an epoch synchronises at the loader's end, `sync_with_dataloader`), and per optimizer step
//! `num_processes` scheduler steps (Accelerate's rule, as AcceleratedScheduler steps), or one under
//! `split_batches`. The value to give a schedule's `num_training_steps`, `total_steps` or `T_max` (per-process
//! counts, as Accelerate's examples compute them from the prepared loader).
template <class Loader>
requires std::integral<Loader> || requires(const Loader& l) { l.size(); }
[[nodiscard]] std::int64_t schedule_steps(const Loader& loader, std::int64_t epochs, std::int64_t accumulation_steps,
                                          std::int64_t num_processes, bool split_batches = false) {
  std::int64_t batches = 0;
  if constexpr (std::integral<Loader>)
    batches = std::int64_t(loader);
  else
    batches = std::int64_t(loader.size());
  detail::require(batches >= 0 && epochs >= 0 && accumulation_steps >= 1 && num_processes >= 1,
                  "accel::schedule_steps: batches and epochs must not be negative, accumulation_steps and "
                  "num_processes must be at least 1");
  const std::int64_t optimizer_steps = epochs * ((batches + accumulation_steps - 1) / accumulation_steps);
  return optimizer_steps * (split_batches ? 1 : num_processes);
}

// [accelerate:scheduler.py AcceleratedScheduler]
//! The user's scheduler, prepared (Accelerate's `AcceleratedScheduler`): steps only after a real optimizer step, N
//! times per optimizer step under `batches::per_process` (the schedule counts every process's batches), once under
//! `batches::split`; none after a step the GradScaler skipped. A handle: copies share one wrapper.
template <TorchScheduler Scheduler>
class AcceleratedScheduler {
 public:
  //! How the scheduler steps (set by `Accelerator::prepare` from the configuration and `Options`).
  struct Options {
    int num_processes = 1;            //!< N: steps per optimizer step under `batches::per_process`
    bool split_batches = false;       //!< `batches::split`: once per optimizer step
    bool step_with_optimizer = true;  //!< false: step on every call, ignoring the optimizer
    bool always_once = false;         //!< step once per optimizer step even with several processes
  };
  //! `optimizers`: the records of the optimizers whose skipped steps hold the scheduler back
  //! (`AcceleratedOptimizer::record()`).
  AcceleratedScheduler(std::shared_ptr<Scheduler> scheduler, std::vector<std::shared_ptr<const StepRecord>> optimizers,
                       Options o)
      : s_(std::make_shared<Shared>(Shared{std::move(scheduler), std::move(optimizers), o})) {}

  //! Steps the scheduler after a real optimizer step (as often as the options say); a scheduler that judges a metric
  //! does not compile here (`step(metric)`).
  void step() {
    static_assert(
        requires(Scheduler & s) { s.step(); },
        "accel: this scheduler steps with a metric (ReduceLROnPlateau): call step(metric), e.g. "
        "sched.step(val_loss)");
    step_with();
  }
  //! Steps a scheduler that judges a metric (`ReduceLROnPlateau`), as often as `step()` would; Accelerate passes
  //! the arguments through the same loop, so under `batches::per_process` the metric is seen N times.
  template <class Metric>
  requires requires(Scheduler& s, Metric m) { s.step(m); }
  void step(Metric metric) { step_with(metric); }
  //! Times the inner scheduler has stepped.
  [[nodiscard]] std::int64_t steps() const noexcept { return s_->count; }
  //! The user's scheduler.
  [[nodiscard]] Scheduler& inner() const noexcept { return *s_->sched; }
  //! The user's scheduler's members.
  [[nodiscard]] Scheduler* operator->() const noexcept { return s_->sched.get(); }

  //! The scheduler's state: its own `save` where it has one (PyTorch's whole `state_dict`), else LibTorch's step
  //! counter, LibTorch's schedulers' only state (the learning rates live in the optimizer's state).
  void save(torch::serialize::OutputArchive& a) const {
    if constexpr (SavesState<Scheduler>) {
      torch::serialize::OutputArchive inner(a.compilation_unit());
      s_->sched->save(inner);
      a.write("scheduler", inner);
    } else {
      a.write("step_count", c10::IValue(std::int64_t(detail::SchedulerAccess::step_count(*s_->sched))));
    }
    a.write("accel_steps", c10::IValue(s_->count));
  }
  //! Restores what `save` wrote; a state `check` refuses changes nothing.
  void load(torch::serialize::InputArchive& a) {
    check(a);
    if constexpr (SavesState<Scheduler>) {
      torch::serialize::InputArchive inner;
      a.read("scheduler", inner);
      s_->sched->load(inner);
    } else {
      detail::SchedulerAccess::step_count(*s_->sched) =
          unsigned(counter(a, "step_count", std::numeric_limits<unsigned>::max()));
    }
    s_->count = counter(a, "accel_steps", std::numeric_limits<std::int64_t>::max());
  }
  //! Refuses (`InvalidArgument` naming the field) a state this scheduler cannot take, changing nothing: a counter
  //! outside what it is kept in (LibTorch's step count is an unsigned int), or the inner scheduler's own refusal.
  void check(torch::serialize::InputArchive& a) const {
    if constexpr (SavesState<Scheduler>) {
      if constexpr (requires(torch::serialize::InputArchive & i) { s_->sched->check(i); }) {
        torch::serialize::InputArchive inner;
        a.read("scheduler", inner);
        s_->sched->check(inner);
      }
    } else {
      counter(a, "step_count", std::numeric_limits<unsigned>::max());
    }
    counter(a, "accel_steps", std::numeric_limits<std::int64_t>::max());
  }

 private:
  // The counter `key` of a saved state: an integer from 0 to `most`.
  static std::int64_t counter(torch::serialize::InputArchive& a, const char* key, std::int64_t most) {
    c10::IValue v;
    a.read(key, v);
    if (!v.isInt() || v.toInt() < 0 || v.toInt() > most)
      throw InvalidArgument(std::string("scheduler state '") + key + "' is " +
                            (v.isInt() ? std::to_string(v.toInt()) : v.tagKind()) + ", outside [0, " +
                            std::to_string(most) + "]");
    return v.toInt();
  }
  // [accelerate:scheduler.py AcceleratedScheduler.step]
  template <class... Args>
  void step_with(Args... args) {
    GradientState::joined(  // a rank out of batches steps its scheduler too (Note [Joined steps])
        GradientState::CallKind::local,
        [&] {
          auto& s = *s_;
          auto once = [&] {
            s.sched->step(args...);
            ++s.count;
          };
          if (!s.opt.step_with_optimizer) return once();
          if (!GradientState::instance().sync_gradients()) return;
          for (const auto& o : s.optimizers)
            if (o->skipped) return;
          const bool per_process = !s.opt.split_batches && !s.opt.always_once;
          for (int i = 0, n = per_process ? s.opt.num_processes : 1; i < n; ++i) {
            // Accelerate's special case for OneCycleLR when the loader's length was not a multiple of the
            // processes: the N steps stop at total_steps instead of raising.
            if constexpr (requires {
                            s.sched->total_steps();
                            s.sched->step_count();
                          }) {
              if (per_process && s.sched->step_count() > s.sched->total_steps()) continue;
            }
            once();
          }
        },
        [&] { return [self = *this, args...]() mutable { self.step_with(args...); }; });
  }

  struct Shared {
    std::shared_ptr<Scheduler> sched;
    std::vector<std::shared_ptr<const StepRecord>> optimizers;
    Options opt;
    std::int64_t count = 0;
  };
  std::shared_ptr<Shared> s_;
};

}  // namespace accel
