#pragma once
//! \file
//! `OneCycleLR`: PyTorch's `lr_scheduler.OneCycleLR`, to the bit (part of optim/schedulers.hpp).

#include <accel/optim/exact_scheduler.hpp>

namespace accel {

// [torch:optim/lr_scheduler.py OneCycleLR]
//! How `OneCycleLR` anneals (PyTorch's `anneal_strategy`: "cos" or "linear").
enum class Anneal { cos, linear };
//! `OneCycleLR`'s options: PyTorch's arguments and defaults.
struct OneCycleLROptions {
  std::vector<double> max_lr;               //!< required: one value, or one per group
  std::int64_t total_steps = 0;             //!< or epochs * steps_per_epoch when 0
  std::int64_t epochs = 0;                  //!< with `steps_per_epoch`, when `total_steps` is 0
  std::int64_t steps_per_epoch = 0;         //!< with `epochs`, when `total_steps` is 0
  double pct_start = 0.3;                   //!< the fraction of the cycle spent raising the rate
  Anneal anneal_strategy = Anneal::cos;     //!< cosine or linear annealing
  bool cycle_momentum = true;               //!< cycle the momentum (or beta1) inversely
  std::vector<double> base_momentum{0.85};  //!< one value, or one per group
  std::vector<double> max_momentum{0.95};   //!< one value, or one per group
  double div_factor = 25.0;                 //!< initial rate = max_lr / div_factor
  double final_div_factor = 1e4;            //!< final rate = initial rate / final_div_factor
  bool three_phase = false;                 //!< three phases (up, down to the initial rate, annihilation)
};
//! The options of the positional spelling `OneCycleLR(opt, max_lr, OneCycleOptions{...})` of earlier versions:
//! `OneCycleLROptions` without `max_lr`, the fields in their former order (so `OneCycleOptions{100}` still sets
//! `total_steps`).
struct OneCycleOptions {
  //!@{
  //! As the field of the same name in `OneCycleLROptions`.
  std::int64_t total_steps = 0;
  std::int64_t epochs = 0;
  std::int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  Anneal anneal_strategy = Anneal::cos;
  bool cycle_momentum = true;
  std::vector<double> base_momentum{0.85};
  std::vector<double> max_momentum{0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
  //!@}
};

//! The groups' initial rates become `max_lr / div_factor` (PyTorch overwrites `initial_lr`), whatever they were.
class OneCycleLR : public ExactScheduler {
 public:
  //! The options struct, `OneCycleLROptions`.
  using Options = OneCycleLROptions;
  //! Sets the groups' initial rates to `max_lr / div_factor` (and the momentum to `max_momentum`) and takes PyTorch's
  //! initial step.
  OneCycleLR(torch::optim::Optimizer& opt, Options o) : ExactScheduler(opt, -1, initial_of(opt, o)), o_(std::move(o)) {
    detail::require(o_.total_steps > 0 || (o_.epochs > 0 && o_.steps_per_epoch > 0),
                    "accel::OneCycleLR: set total_steps, or epochs and steps_per_epoch (all positive)");
    if (o_.total_steps <= 0) o_.total_steps = o_.epochs * o_.steps_per_epoch;
    detail::require(o_.pct_start >= 0 && o_.pct_start <= 1, "accel::OneCycleLR: pct_start must be in [0, 1]");
    const auto n = opt.param_groups().size();
    max_lrs_ = detail::per_group(o_.max_lr, n, "max_lr");
    for (std::size_t i = 0; i < n; ++i) min_lrs_.push_back(base_lrs_[i] / o_.final_div_factor);
    phases_ = make_phases();
    if (o_.cycle_momentum) {
      detail::require(
          detail::momentum_slot(opt.defaults()) != nullptr,
          "accel::OneCycleLR: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, Adam, "
          "AdamW); pass cycle_momentum = false");
      max_m_ = detail::per_group(o_.max_momentum, n, "max_momentum");
      base_m_ = detail::per_group(o_.base_momentum, n, "base_momentum");
      for (std::size_t i = 0; i < n; ++i) momentum(opt.param_groups()[i].options()) = max_m_[i];
    }
    initial_step();
  }
  //! The positional spelling of earlier versions (optim/schedulers.hpp): `max_lr` (one value, or one per group)
  //! apart. A template only so that a braced `{...}` second argument alone is the options form's.
  template <class MaxLr = std::vector<double>>
  requires std::same_as<MaxLr, std::vector<double>> OneCycleLR(torch::optim::Optimizer& opt, const MaxLr& max_lr,
                                                               const OneCycleOptions& o = {})
      : OneCycleLR(opt, Options{.max_lr = max_lr,
                                .total_steps = o.total_steps,
                                .epochs = o.epochs,
                                .steps_per_epoch = o.steps_per_epoch,
                                .pct_start = o.pct_start,
                                .anneal_strategy = o.anneal_strategy,
                                .cycle_momentum = o.cycle_momentum,
                                .base_momentum = o.base_momentum,
                                .max_momentum = o.max_momentum,
                                .div_factor = o.div_factor,
                                .final_div_factor = o.final_div_factor,
                                .three_phase = o.three_phase}) {}
  //! The cycle's length in steps (`AcceleratedScheduler` never steps it past that).
  [[nodiscard]] std::int64_t total_steps() const noexcept { return o_.total_steps; }

 protected:
  std::vector<double> get_lr() override {
    const auto step = last_epoch_;
    if (step > o_.total_steps)
      throw InvalidArgument("accel::OneCycleLR: tried to step " + std::to_string(step) +
                            " times; the specified number of total steps is " + std::to_string(o_.total_steps));
    // The phase of this step (the last one past its end) and how far into it the step is: the same for every group.
    double start = 0.0;
    auto p = phases_.begin();
    for (; double(step) > p->end_step && p + 1 != phases_.end(); ++p) start = p->end_step;
    const double pct = (double(step) - start) / (p->end_step - start);
    auto& groups = opt_.param_groups();
    std::vector<double> lrs;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      lrs.push_back(anneal((this->*p->start_lr)[g], (this->*p->end_lr)[g], pct));
      if (o_.cycle_momentum) momentum(groups[g].options()) = anneal((this->*p->start_m)[g], (this->*p->end_m)[g], pct);
    }
    return lrs;
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    const auto groups = opt_.param_groups().size();
    io("total_steps", o_.total_steps, Bounds<std::int64_t>{1, std::int64_t(1) << 52});  // exact as a double
    io("pct_start", o_.pct_start, Bounds<double>{0.0, 1.0});
    io("three_phase", o_.three_phase);
    io("anneal_cos", o_.anneal_strategy, Anneal::cos, Anneal::linear);
    io("cycle_momentum", o_.cycle_momentum);
    if (io.reading() && o_.cycle_momentum && !detail::momentum_slot(opt_.defaults()))
      throw InvalidArgument("scheduler state 'cycle_momentum' is true, and this optimizer has no momentum or beta1");
    // What PyTorch keeps in the optimizer's groups (initial_lr is base_lrs).
    io.per_group("max_lr", max_lrs_, groups);
    io.per_group("min_lr", min_lrs_, groups);
    io.exactly("max_momentum", max_m_, o_.cycle_momentum ? groups : 0);
    io.exactly("base_momentum", base_m_, o_.cycle_momentum ? groups : 0);
    if (io.reading()) phases_ = make_phases();
  }

 private:
  //! One of the per-group vectors a phase starts or ends at.
  using Ref = std::vector<double> OneCycleLR::*;
  struct Phase {
    double end_step;
    Ref start_lr, end_lr, start_m, end_m;
  };
  static std::vector<double> initial_of(torch::optim::Optimizer& opt, const Options& o) {
    auto v = detail::per_group(o.max_lr, opt.param_groups().size(), "max_lr");
    for (auto& x : v) x /= o.div_factor;
    return v;
  }
  //! PyTorch's `_schedule_phases`, from total_steps, pct_start and three_phase.
  [[nodiscard]] std::vector<Phase> make_phases() const {
    constexpr Ref initial = &OneCycleLR::base_lrs_, max = &OneCycleLR::max_lrs_, min = &OneCycleLR::min_lrs_,
                  max_m = &OneCycleLR::max_m_, base_m = &OneCycleLR::base_m_;
    const double t = double(o_.total_steps);
    if (o_.three_phase)
      return {{o_.pct_start * t - 1, initial, max, max_m, base_m},
              {2 * o_.pct_start * t - 2, max, initial, base_m, max_m},
              {t - 1, initial, min, max_m, max_m}};
    return {{o_.pct_start * t - 1, initial, max, max_m, base_m}, {t - 1, max, min, base_m, max_m}};
  }
  //! A group's cycled momentum or beta1.
  static double& momentum(torch::optim::OptimizerOptions& o) {
    double* m = detail::momentum_slot(o);
    if (!m) throw InvalidArgument("accel: this optimizer has no momentum or beta1");
    return *m;
  }
  [[nodiscard]] double anneal(double start, double end, double pct) const {
    if (o_.anneal_strategy == Anneal::cos) {
      const double cos_out = std::cos(std::numbers::pi * pct) + 1;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  Options o_;  //!< total_steps: as given, or epochs * steps_per_epoch
  std::vector<Phase> phases_;
  std::vector<double> max_lrs_, min_lrs_, max_m_, base_m_;
};
}  // namespace accel
