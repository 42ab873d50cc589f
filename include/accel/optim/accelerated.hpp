#pragma once
//! \file
//! `AcceleratedOptimizer` and `AcceleratedScheduler`: the user's LibTorch optimizer and scheduler, stepping only
//! when gradients are synchronised (Accelerate's `optimizer.py`, `scheduler.py`).
//!
//! | Accelerate                          | accel                                                        |
//! |-------------------------------------|--------------------------------------------------------------|
//! | `AcceleratedOptimizer.step/zero_grad` | no-ops unless `GradientState::sync_gradients()`            |
//! | `step_was_skipped`                  | set by a GradScaler that found inf/NaN (`mark_skipped`)      |
//! | `AcceleratedScheduler.step`         | N steps per real optimizer step under `batches::per_process` (Accelerate's rule: the schedule is sized for the un-sharded loader), 1 under `batches::split`, `always_once` to step once; none after a skipped step |

#include <accel/data/gradient_state.hpp>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace accel {

// [accelerate:optimizer.py AcceleratedOptimizer]
template <class Optimizer>
class AcceleratedOptimizer {
 public:
  explicit AcceleratedOptimizer(std::shared_ptr<Optimizer> optimizer) : opt_(std::move(optimizer)) {}

  //! Steps the inner optimizer when this step synchronises gradients; otherwise nothing.
  void step() {
    if (!GradientState::instance().sync_gradients()) return;
    if (skip_next_) {
      skipped_ = true;
      skip_next_ = false;
      return;
    }
    skipped_ = false;
    opt_->step();
  }
  //! Clears the gradients when this step synchronises (`set_to_none` defaults to true, as in Accelerate).
  void zero_grad(bool set_to_none = true) {
    if (GradientState::instance().sync_gradients()) opt_->zero_grad(set_to_none);
  }
  //! Whether the last synchronising step was skipped (inf/NaN gradients under fp16 scaling).
  [[nodiscard]] bool step_was_skipped() const noexcept { return skipped_; }
  //! Used by the gradient scaler: the next real step finds inf/NaN gradients and is skipped.
  void mark_skipped() noexcept { skip_next_ = true; }
  [[nodiscard]] Optimizer& inner() noexcept { return *opt_; }
  [[nodiscard]] const std::shared_ptr<Optimizer>& shared() const noexcept { return opt_; }

 private:
  std::shared_ptr<Optimizer> opt_;
  bool skipped_ = false, skip_next_ = false;
};

// [accelerate:scheduler.py AcceleratedScheduler]
template <class Scheduler, class Optimizer>
class AcceleratedScheduler {
 public:
  struct Options {
    int num_processes = 1;
    bool split_batches = false;
    bool step_with_optimizer = true;  //!< false: step on every call, ignoring the optimizer
    bool always_once = false;         //!< step once per optimizer step even with several processes
  };
  AcceleratedScheduler(std::shared_ptr<Scheduler> scheduler, std::vector<const AcceleratedOptimizer<Optimizer>*> optimizers,
                       Options o)
      : sched_(std::move(scheduler)), optimizers_(std::move(optimizers)), opt_(o) {}

  void step() {
    if (!opt_.step_with_optimizer) {
      sched_->step();
      ++count_;
      return;
    }
    if (!GradientState::instance().sync_gradients()) return;
    for (const auto* o : optimizers_)
      if (o->step_was_skipped()) return;
    const int times = opt_.split_batches || opt_.always_once ? 1 : opt_.num_processes;
    for (int i = 0; i < times; ++i) sched_->step(), ++count_;
  }
  //! Times the inner scheduler has stepped.
  [[nodiscard]] std::int64_t steps() const noexcept { return count_; }
  [[nodiscard]] Scheduler& inner() noexcept { return *sched_; }

 private:
  std::shared_ptr<Scheduler> sched_;
  std::vector<const AcceleratedOptimizer<Optimizer>*> optimizers_;
  Options opt_;
  std::int64_t count_ = 0;
};

}  // namespace accel
