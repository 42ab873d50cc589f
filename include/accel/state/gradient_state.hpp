#pragma once
//! \file
//! `GradientState`: whether this step synchronises gradients, and what the training loop's helpers need to know
//! about the loader being iterated — whether
//! its current batch is the last one (`end_of_dataloader`) and which rows of it are padding (`layout`, for
//! `gather_for_metrics`). One per process; loaders register while an epoch is in progress, as a stack (nested
//! loops work). Registration is RAII: an abandoned loop unregisters when its iterator goes (Accelerate leaves
//! it on the stack, Q16).
//!
//! Note [Joined steps]: under uneven tails (`tail::uneven`), a rank can run out of batches while others still
//! have some; every rank knows from the plan how many steps the longest rank runs (`LoaderView::steps`). Such a
//! rank records the calls its loop makes through accel in each step (through `joined`: the accelerator's `accumulate`,
//! `backward`, `clip_grad_norm_`, `clip_grad_value_`, `gather_for_metrics`, `gather`, `reduce`, `check_trigger`,
//! the prepared optimizers and schedulers), and when its own batches end, the loader repeats the last step's
//! calls once for every step it lacks, with nothing of its own: zeros to the gradient all-reduce (its accumulated
//! gradients, if any), no rows to `gather_for_metrics`, the identity to `reduce`; then the same optimizer and scheduler
//! steps on the averaged gradients, so parameters and optimizer state stay equal on every rank. No collective is added
//! per step. A rank with as many steps as the longest records nothing, and an even loader costs nothing. A repeated
//! `check_trigger` contributes this rank's flag (0 unless it set the trigger since its last check); when it finds
//! the trigger set, the ranks that still run leave their loops there, so the repeat ends at that call
//! (`stop_repeating`): the rest of that step and the steps after it are not repeated.
//!
//! Note [The joined-step door]: a step's calls are recorded in one place, `GradientState::joined(kind, live,
//! repeat)`, and nowhere else (`record` is private to it). Each call of the user's surface that talks to the other
//! ranks or changes what a step does (the Accelerator's loop members, the prepared model's `operator()`, the
//! prepared optimizer's `step`/`zero_grad` and scheduler's `step`) is written as its live part and what a rank out
//! of batches repeats in its place, so a new helper cannot record before, after or instead of its real call by
//! hand. The call's place in the step is taken before `live` runs, and its repeat is made after (from what `live`
//! computed: the models a backward went through): calls issued inside `live` take the places after it, in the
//! order they ran. That is where the collectives of a model's own units go (full sharding's all-gathers before a
//! unit's forward, reduce-scatters after its backward): each through the door where it is issued, repeated in
//! order with this rank's shard and zero gradients. `tests/static/joined_steps.py` fails when a line of the user's
//! surface issues a collective outside the door without saying why it is not a step's call.

#include <accel/core/structure.hpp>
#include <accel/plan/plan.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

//! Accelerate's `GradientState`, one per process (`instance()`): whether this step synchronises gradients, whether the
//! loop's batch is its loader's last (`end_of_dataloader`), which rows are padding (`layout`), and the joined steps of
//! uneven tails (Note [Joined steps]).
class GradientState {
 public:
  //! What a loader publishes about the batch the loop holds: whether it is the last, and every rank's plan
  //! (the layout of the batch is computed from them only when someone asks).
  struct LoaderView {
    bool end_of_dataloader = false;  //!< Accelerate's flag: this rank's last batch
    //! Every rank's plan of the epoch (null: use `direct`).
    std::shared_ptr<const std::vector<plan::BatchPlan>> plans;
    std::int64_t batch = 0;  //!< the step of the epoch (after skipped ones)
    GatherLayout direct;     //!< used when there are no plans (streams, batch samplers)
    //! Steps of the longest rank in this epoch (known from the plan; -1: every rank runs as many as this one).
    std::int64_t steps = -1;
    //! A rank that has no batch at all in this epoch while others have some (-1: none): it has no step of its
    //! own to repeat (Note [Joined steps]), so a collective in this epoch's steps is an error.
    int starved = -1;
    //! Whether this is the last step of the epoch on every rank: where accumulation must sync.
    [[nodiscard]] bool last_step() const { return steps >= 0 ? batch + 1 == steps : end_of_dataloader; }
    //! Every rank's rows of this batch and how many are real (not padding): what `gather_for_metrics` drops.
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

  //! This process's one `GradientState`.
  static GradientState& instance() {
    static GradientState s;
    return s;
  }

  //! Whether a prepared loader's epoch is in progress.
  [[nodiscard]] bool in_dataloader() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty();
  }
  //! True while the loop holds the last batch of the innermost active loader.
  [[nodiscard]] bool end_of_dataloader() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty() && stack_.back()->view.end_of_dataloader;
  }
  //! True while the loop holds the last step of the innermost loader's epoch on every rank (the same as
  //! `end_of_dataloader` unless the tails are uneven): where accumulation syncs.
  [[nodiscard]] bool last_step() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty() && stack_.back()->view.last_step();
  }
  //! The current batch's layout of the innermost active loader (empty outside a loader).
  [[nodiscard]] GatherLayout layout() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stack_.empty() ? GatherLayout{} : stack_.back()->view.layout();
  }
  //! The rank without any batch in the innermost loader's epoch, or -1 (`LoaderView::starved`).
  [[nodiscard]] int starved_rank() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stack_.empty() ? -1 : stack_.back()->view.starved;
  }

  //! A call of the loop's step that a rank out of batches repeats (Note [Joined steps]); it returns what must
  //! live until the end of the repeated step (a sync scope), or nothing.
  using StepCall = std::function<std::shared_ptr<void>()>;
  //! What a recorded call does: decides the step's sync (`accumulate`), talks to the other ranks
  //! (`collective`: backward's all-reduce, `gather`, `reduce`, `check_trigger`), gathers a batch's rows
  //! (`gather_for_metrics`), or stays on this rank (`local`: optimizer, scheduler, clipping).
  enum class CallKind { accumulate, local, collective, gather_for_metrics };

  //! Sets what runs at a step boundary (empty: nothing): where the loop asks a prepared loader for its next
  //! batch after holding one, provided every rank held that batch too (so that every rank is at the same
  //! boundary; not while a rank out of batches repeats steps). `Options::preemption` checks for a signal there.
  //! `owner` identifies who set it (an Accelerator): it alone clears it.
  void set_step_boundary_hook(const void* owner, std::function<void()> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    boundary_ = std::move(hook);
    boundary_owner_.store(owner, std::memory_order_relaxed);
  }
  //! Removes the step boundary hook if `owner` set it.
  void clear_step_boundary_hook(const void* owner) {
    std::lock_guard<std::mutex> lock(mu_);
    if (boundary_owner_.load(std::memory_order_relaxed) != owner) return;
    boundary_ = nullptr;
    boundary_owner_.store(nullptr, std::memory_order_relaxed);
  }
  //! Who set the step boundary hook (null: none).
  [[nodiscard]] const void* step_boundary_owner() const noexcept {
    return boundary_owner_.load(std::memory_order_relaxed);
  }
  //! Whether the innermost loader's epoch needs this rank's calls recorded (`record` is a no-op otherwise:
  //! build the call only when this is true).
  [[nodiscard]] bool recording() const {
    if (recorders_.load(std::memory_order_relaxed) == 0) return false;  // no uneven epoch: nothing to lock
    std::lock_guard<std::mutex> lock(mu_);
    return !stack_.empty() && stack_.back()->records && !replaying_;
  }
  //! The one door of a step's calls (Note [Joined steps], Note [The joined-step door]): runs `live()` and returns
  //! what it returns. While this rank's calls are recorded, the call first takes its place in the step's record,
  //! so calls issued inside `live` (a prepared model's, for one) are recorded after it, in the order they ran; once
  //! `live` has returned, `repeat()` makes what a rank out of batches runs at this place in each step it lacks (a
  //! callable returning nothing, `nullptr`, or a `std::shared_ptr` that lives until the repeated step ends). A
  //! `live` that throws leaves nothing to repeat. `repeat` runs only while recording: its captures cost nothing in
  //! an even epoch.
  template <class Live, class Repeat>
  static decltype(auto) joined(CallKind kind, Live&& live, Repeat&& repeat) {
    auto& gs = instance();
    if (!gs.recording()) return std::forward<Live>(live)();
    auto slot = std::make_shared<StepCall>();
    gs.record(kind, [slot]() -> std::shared_ptr<void> { return *slot ? (*slot)() : nullptr; });
    auto fill = [&] { *slot = step_call(std::forward<Repeat>(repeat)()); };
    if constexpr (std::is_void_v<std::invoke_result_t<Live>>) {
      std::forward<Live>(live)();
      fill();
    } else {
      decltype(auto) out = std::forward<Live>(live)();
      fill();
      return out;
    }
  }
  //! Called from a repeated call (Note [Joined steps]): the ranks that still run leave their loops at this call,
  //! so the rest of this step and the steps after it are not repeated. A no-op outside a repeated step.
  void stop_repeating() {
    std::lock_guard<std::mutex> lock(mu_);
    if (replaying_) stopped_ = true;
  }
  //! On the last batch of a rank that runs out first, inside an evaluation loop (one `gather_for_metrics` per
  //! step and no other collective): the layouts of the steps this rank lacks, whose rows its
  //! `gather_for_metrics` gathers now, so that its loop sees every sample too; the repeated steps then skip
  //! it. Empty otherwise (the rows of a repeated step reach the ranks that still run).
  [[nodiscard]] std::vector<GatherLayout> gather_ahead() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stack_.empty() || replaying_) return {};
    Entry& e = *stack_.back();
    if (!e.records || !e.view.end_of_dataloader || e.missing.empty() || e.pulled) return {};
    auto eval_only = [](const std::vector<Recorded>& calls, int gathers) {
      for (const auto& c : calls) {
        if (c.kind == CallKind::collective) return false;
        gathers -= c.kind == CallKind::gather_for_metrics;
      }
      return gathers == 0;
    };
    if (!eval_only(e.current, 0)) return {};              // this step so far: no collective, no gather yet
    if (!e.had_step || !eval_only(e.last, 1)) return {};  // the step before: exactly one gather
    e.pulled = true;
    std::vector<GatherLayout> out;
    for (const auto& v : e.missing) out.push_back(v.layout());
    return out;
  }
  //! How many loaders' epochs are in progress (nested loops).
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
  //! Sets `sync_gradients()` (the `Accumulation` does, once per step).
  void set_sync_gradients(bool sync) {
    std::lock_guard<std::mutex> lock(mu_);
    sync_gradients_ = sync;
  }

 private:
  struct Recorded {
    CallKind kind;
    StepCall call;
  };
  struct Entry {
    LoaderView view;
    bool records = false;   // this rank's step calls are recorded (Note [Joined steps])
    bool holding = false;   // the loop holds a batch of this epoch
    bool had_step = false;  // `last` holds a complete step
    bool pulled = false;    // gather_for_metrics gathered the missing steps' rows ahead (gather_ahead)
    std::vector<Recorded> current, last,
        last_sync;                    // this step's calls, the last step's, the last synchronising step's
    std::vector<LoaderView> missing;  // the steps this rank lacks
  };

 public:
  //! RAII registration of one loader's epoch.
  class Registration {
   public:
    Registration() = default;
    //! Registers with `gs`, or with nothing when `gs` is null (a loader that publishes nothing).
    explicit Registration(GradientState* gs) : gs_(gs) {
      if (gs_) gs_->push(&entry_);
    }
    ~Registration() {
      if (!gs_) return;
      gs_->remove(&entry_);
      if (entry_.records) gs_->recorders_.fetch_sub(1);
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    //! Publishes the batch the loop now holds (the calls of the previous step become the step to repeat).
    void update(LoaderView view) {
      if (!gs_) return;
      std::lock_guard<std::mutex> lock(gs_->mu_);
      if (entry_.records && entry_.holding) close_step();
      entry_.holding = true;
      entry_.view = std::move(view);
    }
    //! The loop asks for the batch after the one it holds: runs the step boundary hook if every rank is here.
    void at_step_boundary() {
      if (!gs_ || gs_->boundary_owner_.load(std::memory_order_relaxed) == nullptr) return;
      std::function<void()> hook;
      {
        std::lock_guard<std::mutex> lock(gs_->mu_);
        if (!entry_.holding || gs_->replaying_) return;
        const LoaderView& v = entry_.view;
        if (v.steps >= 0) {  // ranks may run different numbers of steps: every one must have held batch v.batch
          if (v.plans) {
            for (const auto& p : *v.plans)
              if (p.size() <= v.batch) return;
          } else {
            for (const auto rows : v.direct.size)  // a user batch sampler's step: every rank's rows of it
              if (rows <= 0) return;
          }
        }
        hook = gs_->boundary_;
      }
      if (hook) hook();  // outside the lock: it talks to the other ranks and may save a checkpoint
    }
    //! Records this rank's step calls from now on: it lacks the steps `missing` of the longest rank.
    void record_steps(std::vector<LoaderView> missing) {
      if (!gs_) return;
      std::lock_guard<std::mutex> lock(gs_->mu_);
      if (!entry_.records) gs_->recorders_.fetch_add(1);
      entry_.records = true;
      entry_.missing = std::move(missing);
    }
    //! This rank's batches are over: repeats its last step once for each step it lacks (Note [Joined steps]):
    //! the step's `accumulate` first, then the rest of the last step that synchronised when this one does, else
    //! of the last step; until a repeated call ends the repeat (`stop_repeating`). Returns false when there is no
    //! step to repeat (the rank had no batch).
    bool join() {
      if (!gs_ || entry_.missing.empty()) return true;
      std::vector<Recorded> last, last_sync;
      bool pulled = false;
      {
        std::lock_guard<std::mutex> lock(gs_->mu_);
        if (entry_.holding) close_step(), entry_.holding = false;
        if (!entry_.had_step) return false;
        last = entry_.last, last_sync = entry_.last_sync, pulled = entry_.pulled;
      }
      bool stopped = false;
      for (std::size_t m = 0; m < entry_.missing.size() && !stopped; ++m) {
        {
          std::lock_guard<std::mutex> lock(gs_->mu_);
          entry_.view = entry_.missing[m];
          gs_->replaying_ = true;
          gs_->stopped_ = false;
        }
        struct Done {
          GradientState* gs;
          ~Done() {
            std::lock_guard<std::mutex> lock(gs->mu_);
            gs->replaying_ = false;
            gs->stopped_ = false;
          }
        } done{gs_};
        std::vector<std::shared_ptr<void>> held;  // released in reverse order at the step's end
        std::size_t first = 0;
        const std::vector<Recorded>* calls = &last;
        if (!last.empty() && last.front().kind == CallKind::accumulate) {
          held.push_back(last.front().call());
          first = 1;
          if (gs_->sync_gradients() && !last_sync.empty() && last_sync.front().kind == CallKind::accumulate)
            calls = &last_sync;
        }
        for (std::size_t i = first; i < calls->size(); ++i) {
          if (pulled && (*calls)[i].kind == CallKind::gather_for_metrics) continue;  // gathered ahead
          held.push_back((*calls)[i].call());
          stopped = gs_->stopped();  // the ranks still running left their loops at this call
          if (stopped) break;
        }
        while (!held.empty()) held.pop_back();
      }
      return true;
    }

   private:
    // The step the loop held is over (called under the lock): it becomes the step to repeat.
    void close_step() {
      if (gs_->sync_gradients_) entry_.last_sync = entry_.current;
      entry_.last = std::exchange(entry_.current, {});
      entry_.had_step = true;
    }
    GradientState* gs_ = nullptr;
    Entry entry_;
  };

 private:
  // Records `call` as part of the current step of the innermost loader, when its epoch needs it: only through
  // `joined`, the door.
  void record(CallKind kind, StepCall call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stack_.empty() || !stack_.back()->records || replaying_) return;
    stack_.back()->current.push_back({kind, std::move(call)});
  }
  // A repeated call as the record keeps it: what it returns lives until the repeated step ends.
  template <class F>
  static StepCall step_call(F f) {
    return [f = std::move(f)]() mutable -> std::shared_ptr<void> {
      if constexpr (std::is_void_v<std::invoke_result_t<F&>>)
        return f(), nullptr;
      else
        return f();
    };
  }
  void push(Entry* e) {
    std::lock_guard<std::mutex> lock(mu_);
    stack_.push_back(e);
  }
  void remove(Entry* e) {
    std::lock_guard<std::mutex> lock(mu_);
    stack_.erase(std::remove(stack_.begin(), stack_.end(), e), stack_.end());
  }
  [[nodiscard]] bool stopped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }
  mutable std::mutex mu_;
  std::vector<Entry*> stack_;
  bool sync_gradients_ = true;
  bool replaying_ = false;
  bool stopped_ = false;            // a repeated call ended the repeat (stop_repeating)
  std::atomic<int> recorders_{0};   // registrations that record their steps
  std::function<void()> boundary_;  // the step boundary hook (set_step_boundary_hook)
  std::atomic<const void*> boundary_owner_{nullptr};
};

}  // namespace accel
