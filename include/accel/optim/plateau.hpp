#pragma once
//! \file
//! `ReduceLROnPlateau`: PyTorch's `lr_scheduler.ReduceLROnPlateau`, to the bit (part of optim/schedulers.hpp).

#include <accel/optim/exact_scheduler.hpp>

namespace accel {

// [torch:optim/lr_scheduler.py ReduceLROnPlateau]
//! Whether a lower (`min`) or a higher (`max`) metric is better (PyTorch's `mode`).
enum class PlateauMode { min, max };
//! How `threshold` is applied (PyTorch's `threshold_mode`): relative to the best value, or absolute.
enum class ThresholdMode { rel, abs };
//! `ReduceLROnPlateau`'s options: PyTorch's arguments and defaults.
struct ReduceLROnPlateauOptions {
  PlateauMode mode = PlateauMode::min;                //!< lower or higher is better
  double factor = 0.1;                                //!< new rate = rate * factor (< 1)
  std::int64_t patience = 10;                         //!< steps without improvement tolerated before a reduction
  double threshold = 1e-4;                            //!< the least change that counts as an improvement
  ThresholdMode threshold_mode = ThresholdMode::rel;  //!< `threshold` relative or absolute
  std::int64_t cooldown = 0;                          //!< steps to wait after a reduction before counting again
  std::vector<double> min_lr{0.0};                    //!< one value for every group, or one per group
  double eps = 1e-8;                                  //!< a reduction smaller than this is skipped
};
using PlateauOptions = ReduceLROnPlateauOptions;  //!< the former name

//! Lowers the rates by `factor` once the metric passed to `step(metric)` has not improved for more than
//! `patience` steps. Derived from `torch::optim::LRScheduler` so that `prepare` takes it; its `step()` without a
//! metric is deleted: `step()` on it, or on its `AcceleratedScheduler`, does not compile; through a
//! `torch::optim::LRScheduler&` (whose `step()` is not virtual) it throws at once, naming the fix.
class ReduceLROnPlateau : public torch::optim::LRScheduler, public detail::SavedFields<ReduceLROnPlateau> {
  friend class detail::SavedFields<ReduceLROnPlateau>;

 public:
  //! The options struct, `ReduceLROnPlateauOptions`.
  using Options = ReduceLROnPlateauOptions;
  //! Reads the groups' current rates; no step is taken.
  explicit ReduceLROnPlateau(torch::optim::Optimizer& opt, Options o = {})
      : torch::optim::LRScheduler(opt), opt_(opt), o_(std::move(o)) {
    detail::require(o_.factor < 1.0, "accel::ReduceLROnPlateau: factor should be < 1.0");
    const auto n = opt.param_groups().size();
    if (o_.min_lr.size() == 1) default_min_lr_ = o_.min_lr[0];  // PyTorch's min_lr given as a number
    min_lrs_ = detail::per_group(o_.min_lr, n, "min_lr");
    last_lr_ = current_lrs();
    reset();
  }

  void step() = delete;  //!< a plateau is judged on a metric: `step(metric)`
  // [torch:optim/lr_scheduler.py ReduceLROnPlateau.step]
  //! One step judged on `metric` (PyTorch's `step(metrics)`): after more than `patience` steps without improvement,
  //! each group's rate becomes `max(rate * factor, min_lr)`, then `cooldown` steps pass before counting again.
  void step(double metric) {
    const double current = metric;
    const std::int64_t epoch = last_epoch_ + 1;
    last_epoch_ = epoch;
    if (is_better(current, best_)) {
      best_ = current;
      num_bad_epochs_ = 0;
    } else {
      ++num_bad_epochs_;
    }
    if (in_cooldown()) {
      --cooldown_counter_;
      num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
    }
    if (num_bad_epochs_ > o_.patience) {
      reduce_lr();
      cooldown_counter_ = o_.cooldown;
      num_bad_epochs_ = 0;
    }
    last_lr_ = current_lrs();
  }

  //! The rates after the last step (PyTorch's `get_last_lr()`).
  [[nodiscard]] const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  //! Steps taken (PyTorch's `last_epoch`).
  [[nodiscard]] std::int64_t last_epoch() const noexcept { return last_epoch_; }
  //! The best metric so far (PyTorch's `best`).
  [[nodiscard]] double best() const noexcept { return best_; }
  //! Steps since the last improvement (PyTorch's `num_bad_epochs`).
  [[nodiscard]] std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  //! Cooldown steps left (PyTorch's `cooldown_counter`).
  [[nodiscard]] std::int64_t cooldown_counter() const noexcept { return cooldown_counter_; }
  //! Whether a cooldown is in progress (PyTorch's `in_cooldown`).
  [[nodiscard]] bool in_cooldown() const noexcept { return cooldown_counter_ > 0; }

  // save / load: detail::SavedFields, through fields().
 private:
  std::vector<double> get_lrs() override {
    throw InvalidArgument(
        "accel::ReduceLROnPlateau steps with a metric: call step(metric) on the scheduler or on its "
        "AcceleratedScheduler (sched.step(val_loss)), not step() through a torch::optim::LRScheduler&");
  }
  [[nodiscard]] std::vector<double> current_lrs() const {
    std::vector<double> out;
    for (const auto& g : opt_.param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  void fields(StateIO& io) {
    io("mode_max", o_.mode, PlateauMode::max, PlateauMode::min);
    const auto groups = opt_.param_groups().size();
    constexpr auto counter = Bounds<std::int64_t>{0};
    io("factor", o_.factor, Bounds<double>{std::numeric_limits<double>::lowest(), std::nextafter(1.0, 0.0)});
    io("patience", o_.patience);
    io("threshold", o_.threshold);
    io("threshold_abs", o_.threshold_mode, ThresholdMode::abs, ThresholdMode::rel);
    io("cooldown", o_.cooldown);
    io.per_group("min_lrs", min_lrs_, groups);
    io("eps", o_.eps);
    io("last_epoch", last_epoch_, counter);
    io.per_group("last_lr", last_lr_, groups);
    io("best", best_);  // infinite until a first metric
    io("num_bad_epochs", num_bad_epochs_, counter);
    io("cooldown_counter", cooldown_counter_);  // from cooldown, which may be negative
  }
  void reset() {
    best_ = mode_worse();
    cooldown_counter_ = 0;
    num_bad_epochs_ = 0;
  }
  [[nodiscard]] double mode_worse() const {
    constexpr double inf = std::numeric_limits<double>::infinity();
    return o_.mode == PlateauMode::min ? inf : -inf;
  }
  [[nodiscard]] bool is_better(double a, double best) const {
    const bool rel = o_.threshold_mode == ThresholdMode::rel;
    if (o_.mode == PlateauMode::min) return rel ? a < best * (1.0 - o_.threshold) : a < best - o_.threshold;
    return rel ? a > best * (o_.threshold + 1.0) : a > best + o_.threshold;
  }
  void reduce_lr() {
    auto& groups = opt_.param_groups();
    if (groups.size() != min_lrs_.size()) {
      detail::require(default_min_lr_.has_value(),
                      "accel::ReduceLROnPlateau: the optimizer has " + std::to_string(groups.size()) +
                          " parameter groups, min_lr was given for " + std::to_string(min_lrs_.size()));
      min_lrs_.assign(groups.size(), *default_min_lr_);
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double old_lr = groups[i].options().get_lr();
      const double new_lr = std::max(old_lr * o_.factor, min_lrs_[i]);
      if (old_lr - new_lr > o_.eps) groups[i].options().set_lr(new_lr);
    }
  }

  torch::optim::Optimizer& opt_;
  Options o_;
  std::optional<double> default_min_lr_;
  std::vector<double> min_lrs_, last_lr_;
  std::int64_t last_epoch_ = 0;
  double best_ = 0.0;
  std::int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0;
};

}  // namespace accel
