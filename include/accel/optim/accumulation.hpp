#pragma once
//! \file
//! Gradient accumulation: when a step synchronises gradients (Accelerate's `accumulate` / `_do_sync`).
//!
//! Each `begin_step()` (one per batch, before the forward pass) decides: at the end of the loader (when
//! `sync_with_dataloader`; under uneven tails, the last step of the longest rank, the same on every rank) the
//! counter resets to 0 and the step syncs; otherwise the counter advances and the
//! step syncs every `steps`-th time. The decision lands in `GradientState::sync_gradients()`, which the
//! optimizer and scheduler wrappers read. `allow_sync()` adds `sync_each_batch` (reduce every batch, step every
//! `steps`), for the model's no_sync.

#include <accel/error.hpp>
#include <accel/state/gradient_state.hpp>

#include <cstdint>
#include <string>

namespace accel {

//! When gradients are synchronised (the `Accumulation` an `Accelerator` builds from `Options`).
struct AccumulationOptions {
  int steps = 1;                     //!< gradient_accumulation_steps
  bool sync_with_dataloader = true;  //!< force a sync (and a counter reset) on the loader's last batch
  bool sync_each_batch = false;      //!< all-reduce every batch even when not stepping (memory over speed)
};

// [accelerate:accelerator.py Accelerator._do_sync / accumulate]
//! Gradient accumulation's counter (Accelerate's `accumulate` / `_do_sync`): `begin_step()` decides, once per batch,
//! whether this step synchronises gradients, and publishes it in `GradientState::sync_gradients()`.
class Accumulation {
 public:
  //! An accumulation of `o.steps` batches per optimizer step (at least 1).
  explicit Accumulation(AccumulationOptions o = {}) : opt_(o) {
    detail::require(o.steps >= 1,
                    "accel: gradient_accumulation_steps must be at least 1 (got " + std::to_string(o.steps) + ")");
  }
  //! Decides whether this step syncs; returns the decision.
  bool begin_step(GradientState& gs = GradientState::instance()) {
    bool sync;
    if (opt_.sync_with_dataloader && gs.last_step()) {  // every rank's last step (Note [Joined steps])
      step_ = 0;
      sync = true;
    } else {
      ++step_;
      sync = step_ % opt_.steps == 0;
    }
    gs.set_sync_gradients(sync);
    return sync;
  }
  //! Accelerate's `Accelerator.step`: steps since the last sync at the end of a loader.
  [[nodiscard]] std::int64_t step() const noexcept { return step_; }
  //! Batches per optimizer step (`gradient_accumulation_steps`).
  [[nodiscard]] int steps() const noexcept { return opt_.steps; }
  //! Whether gradients are reduced across processes in this step (sync, or sync_each_batch).
  [[nodiscard]] bool allow_sync(const GradientState& gs = GradientState::instance()) const {
    return gs.sync_gradients() || opt_.sync_each_batch;
  }
  //! Resets the counter.
  void reset() noexcept { step_ = 0; }
  //! Restores the counter (checkpoints).
  void set_step(std::int64_t step) noexcept { step_ = step; }

 private:
  AccumulationOptions opt_;
  std::int64_t step_ = 0;
};

}  // namespace accel
