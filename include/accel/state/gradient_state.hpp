#pragma once
//! \file
//! `GradientState`: whether this step synchronises gradients, and what the training loop's helpers need to know
//! about the loader being iterated — whether
//! its current batch is the last one (`end_of_dataloader`) and which rows of it are padding (`layout`, for
//! `gather_for_metrics`). One per process; loaders register while an epoch is in progress, as a stack (nested
//! loops work). Registration is RAII: an abandoned loop unregisters when its iterator goes (Accelerate leaves
//! it on the stack, Q16).

#include <accel/core/structure.hpp>
#include <accel/plan/plan.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace accel {

class GradientState {
 public:
  //! What a loader publishes about the batch the loop holds: whether it is the last, and every rank's plan
  //! (the layout of the batch is computed from them only when someone asks).
  struct LoaderView {
    bool end_of_dataloader = false;
    std::shared_ptr<const std::vector<plan::BatchPlan>> plans;
    std::int64_t batch = 0;
    GatherLayout direct;  //!< used when there are no plans (streams)
    [[nodiscard]] GatherLayout layout() const {
      GatherLayout out;
      if (!plans) return direct;
      for (const auto& p : *plans) {
        const bool has = batch < p.size();
        out.size.push_back(has ? p.span(batch).size() : 0);
        out.real.push_back(has ? p.real(batch) : 0);
      }
      return out;
    }
  };

  static GradientState& instance() {
    static GradientState s;
    return s;
  }

  [[nodiscard]] bool in_dataloader() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty();
  }
  //! True while the loop holds the last batch of the innermost active loader.
  [[nodiscard]] bool end_of_dataloader() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty() && stack_.back()->end_of_dataloader;
  }
  //! The current batch's layout of the innermost active loader (empty outside a loader).
  [[nodiscard]] GatherLayout layout() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stack_.empty() ? GatherLayout{} : stack_.back()->layout();
  }
  [[nodiscard]] std::size_t active_loaders() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stack_.size();
  }
  //! Whether this step synchronises gradients (and so whether the optimizer and scheduler really step).
  //! True outside gradient accumulation; set by `Accumulation::begin_step`.
  [[nodiscard]] bool sync_gradients() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sync_gradients_;
  }
  void set_sync_gradients(bool sync) {
    std::lock_guard<std::mutex> lock(mu_);
    sync_gradients_ = sync;
  }

  //! RAII registration of one loader's epoch.
  class Registration {
   public:
    Registration() = default;
    //! Registers with `gs`, or with nothing when `gs` is null (a loader that publishes nothing).
    explicit Registration(GradientState* gs) : gs_(gs) {
      if (gs_) gs_->push(&view_);
    }
    ~Registration() {
      if (gs_) gs_->remove(&view_);
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    //! Publishes the batch the loop now holds.
    void update(LoaderView view) {
      if (!gs_) return;
      std::lock_guard<std::mutex> lock(gs_->mu_);
      view_ = std::move(view);
    }

   private:
    GradientState* gs_ = nullptr;
    LoaderView view_;
  };

 private:
  void push(LoaderView* v) {
    std::lock_guard<std::mutex> lock(mu_);
    stack_.push_back(v);
  }
  void remove(LoaderView* v) {
    std::lock_guard<std::mutex> lock(mu_);
    stack_.erase(std::remove(stack_.begin(), stack_.end(), v), stack_.end());
  }
  mutable std::mutex mu_;
  std::vector<LoaderView*> stack_;
  bool sync_gradients_ = true;
};

}  // namespace accel
