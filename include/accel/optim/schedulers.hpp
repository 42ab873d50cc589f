#pragma once
//! \file
//! Learning-rate schedulers that step as PyTorch's `torch.optim.lr_scheduler` do, to the bit.
//!
//! LibTorch's own `torch::optim::StepLR` changes the rate one step later than PyTorch's: its `step()` computes
//! the rates from a step count taken *before* it is incremented, while PyTorch's constructor performs an initial
//! step, so that `last_epoch` is 0 after construction and k after k steps. A job ported from Python diverges
//! there. These schedulers follow PyTorch 2.x (`torch/optim/lr_scheduler.py`) line by line: the same state
//! (`last_epoch`, `base_lrs`, `_last_lr`, `_step_count`), the same *chainable* recurrences in `get_lr()` (most
//! multiply the optimizer's current rate, so the arithmetic, and its rounding, is PyTorch's), the same closed forms
//! where PyTorch uses them (SequentialLR at a milestone), in double.
//!
//! **One construction style.** Every scheduler is built from its optimizer and one options struct whose fields are
//! PyTorch's (or transformers') argument names, with PyTorch's defaults, written with designated initializers:
//! `Scheduler(optimizer, SchedulerOptions{.name = value, ...})`, the struct also reachable as `Scheduler::Options`.
//! Arguments PyTorch requires (StepLR's `step_size`, CosineAnnealingLR's `T_max`, ...) are fields too; a value the
//! constructor cannot use is an `InvalidArgument` naming it. transformers' schedules are functions of the same shape
//! returning the `LambdaLR` transformers returns: `cosine_schedule_with_warmup(opt, {.num_warmup_steps = ...})`.
//!
//! PyTorch's schedulers keep their `torch.optim.lr_scheduler` names; the options struct of `X` is `XOptions`:
//!
//! | scheduler                     | options fields                                                              |
//! |-------------------------------|-----------------------------------------------------------------------------|
//! | `StepLR`                      | `step_size`, `gamma`                                                        |
//! | `MultiStepLR`                 | `milestones`, `gamma` (a repeated milestone decays by gamma^count)          |
//! | `ConstantLR`                  | `factor`, `total_iters`                                                     |
//! | `LinearLR`                    | `start_factor`, `end_factor`, `total_iters`                                 |
//! | `ExponentialLR`               | `gamma`                                                                     |
//! | `PolynomialLR`                | `total_iters`, `power`                                                      |
//! | `CosineAnnealingLR`           | `T_max`, `eta_min`                                                          |
//! | `CosineAnnealingWarmRestarts` | `T_0`, `T_mult`, `eta_min`                                                  |
//! | `CyclicLR`                    | `base_lr`, `max_lr`, `step_size_up`, `step_size_down`, `mode`, `gamma`, (*) |
//! | `OneCycleLR`                  | `max_lr`, `total_steps`, ..., `three_phase`, (*)                            |
//! | `LambdaLR`                    | `lr_lambda` (one function, or one per group)                                |
//! | `MultiplicativeLR`            | `lr_lambda` (one function, or one per group)                                |
//! | `SequentialLR`                | `schedulers`, `milestones`                                                  |
//! | `ChainedScheduler`            | `schedulers`                                                                |
//! | `ReduceLROnPlateau`           | `mode`, `factor`, `patience`, ...; stepped with `step(metric)`              |
//!
//! (*) also `cycle_momentum`, `base_momentum`, `max_momentum` (SGD's and RMSprop's momentum, Adam's and AdamW's beta1).
//!
//! transformers' schedules drop the `get_` of their names; the options struct of `x_y` is `XYOptions`:
//!
//! | function                                         | options fields                                              |
//! |--------------------------------------------------|-------------------------------------------------------------|
//! | `constant_schedule_with_warmup`                  | `num_warmup_steps`                                          |
//! | `linear_schedule_with_warmup`                    | `num_warmup_steps`, `num_training_steps`                    |
//! | `cosine_schedule_with_warmup`                    | `num_warmup_steps`, `num_training_steps`, `num_cycles`      |
//! | `cosine_with_hard_restarts_schedule_with_warmup` | `num_warmup_steps`, `num_training_steps`, `num_cycles`      |
//! | `polynomial_decay_schedule_with_warmup`          | `num_warmup_steps`, `num_training_steps`, `lr_end`, `power` |
//! | `inverse_sqrt_schedule`                          | `num_warmup_steps`, `timescale`                             |
//!
//! **Positional spellings.** `StepLR(opt, step_size, gamma)`, `MultiStepLR(opt, milestones, gamma)`,
//! `ExponentialLR(opt, gamma)`, `LinearLR(opt, start, end, total_iters)`, `CosineAnnealingLR(opt, T_max, eta_min)`,
//! `OneCycleLR(opt, max_lr, OneCycleOptions{...})`, `LambdaLR(opt, fn)`, `LambdaLR(opt, {fn0, fn1})`,
//! `SequentialLR(opt, {s0, s1}, milestones)`, `constant_schedule_with_warmup(opt, warmup)`,
//! `linear_schedule_with_warmup(opt, warmup, total)` and `cosine_schedule_with_warmup(opt, warmup, total, cycles)`
//! are the positional spellings of earlier versions, kept so existing code compiles; new code uses the options
//! form. A braced second argument alone (`LinearLR(opt, {})`, `LambdaLR(opt, {fn})`) is the options form.
//!
//! Each derives from `torch::optim::LRScheduler` (so `Accelerator::prepare` takes a `std::shared_ptr` of it as it
//! takes LibTorch's), and `save`/`load` its whole state as PyTorch's `state_dict` does; `save_state` uses them. The
//! rates themselves live in the optimizer's parameter groups, which the checkpoint saves with the optimizer. A
//! scheduler of one's own derives from `ExactScheduler` (optim/exact_scheduler.hpp says what it overrides).
//!
//! **How long a schedule is.** A prepared scheduler steps once per optimizer step per process (Accelerate's rule:
//! the schedule counts the batches of all processes), once per optimizer step under `batches::split`.
//! `schedule_steps(loader, epochs, accumulation_steps, num_processes)` is that count, for `num_training_steps`,
//! `total_steps` or `T_max`; `Accelerator::schedule_steps(loader, epochs)` fills in the job's own settings.
//!
//! ```cpp
//! auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(3e-4));
//! auto [model, opt, loader] = acc.prepare(net, adamw, accel::data::DataLoader(ds, {.batch_size = 32}));
//! auto sched = acc.prepare(accel::linear_schedule_with_warmup(
//!     *adamw, {.num_warmup_steps = 100, .num_training_steps = acc.schedule_steps(loader, epochs)}));
//! auto step = std::make_shared<accel::StepLR>(*adamw, accel::StepLROptions{.step_size = 30, .gamma = 0.5});
//! ```

#include <accel/detail/linkage.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/exact_scheduler.hpp>
#include <accel/optim/one_cycle.hpp>
#include <accel/optim/plateau.hpp>

namespace accel {

// [torch:optim/lr_scheduler.py StepLR]
//! `StepLR`'s options: PyTorch's arguments and defaults.
struct StepLROptions {
  std::int64_t step_size = 0;    //!< required: positive
  double gamma = 0.1;            //!< decay factor
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! The rates decay by `gamma` every `step_size` steps (PyTorch's `StepLR`, which LibTorch's own applies one step late).
class StepLR : public ExactScheduler {
 public:
  //! The options struct, `StepLROptions`.
  using Options = StepLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  StepLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), step_size_(o.step_size), gamma_(o.gamma) {
    detail::require(o.step_size > 0,
                    "accel::StepLR: step_size must be positive (it is " + std::to_string(o.step_size) + ")");
    initial_step();
  }
  //! The positional spelling of earlier versions (see the file's comment).
  StepLR(torch::optim::Optimizer& opt, std::int64_t step_size, double gamma = 0.1, std::int64_t last_epoch = -1)
      : StepLR(opt, Options{.step_size = step_size, .gamma = gamma, .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return current_lrs();
    return scaled(current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return scaled(base_lrs_, std::pow(gamma_, double(last_epoch_ / step_size_)));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("step_size", step_size_, Bounds<std::int64_t>{1});
    io("gamma", gamma_, Bounds<double>{});
  }

 private:
  std::int64_t step_size_;
  double gamma_;
};

// [torch:optim/lr_scheduler.py MultiStepLR]
//! `MultiStepLR`'s options: PyTorch's arguments and defaults.
struct MultiStepLROptions {
  std::vector<std::int64_t> milestones;  //!< the steps at which the rates decay (any order)
  double gamma = 0.1;                    //!< decay factor
  std::int64_t last_epoch = -1;          //!< -1: a new schedule; k: resume at step k+1
};
//! The rates decay by `gamma` at each milestone (PyTorch's `MultiStepLR`; a milestone given twice decays twice).
class MultiStepLR : public ExactScheduler {
 public:
  //! The options struct, `MultiStepLROptions`.
  using Options = MultiStepLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  MultiStepLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), milestones_(std::move(o.milestones)), gamma_(o.gamma) {
    std::ranges::sort(milestones_);  // PyTorch keeps a Counter: order does not matter, repeats do
    initial_step();
  }
  //! The positional spelling of earlier versions (a template only so that `MultiStepLR(opt, {})` is the options form).
  template <class Milestones = std::vector<std::int64_t>>
  requires std::same_as<Milestones, std::vector<std::int64_t>> MultiStepLR(torch::optim::Optimizer& opt,
                                                                           Milestones milestones, double gamma = 0.1,
                                                                           std::int64_t last_epoch = -1)
      : MultiStepLR(opt, Options{.milestones = std::move(milestones), .gamma = gamma, .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    const auto n = std::ranges::count(milestones_, last_epoch_);
    if (n == 0) return current_lrs();
    return scaled(current_lrs(), std::pow(gamma_, double(n)));
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    const auto passed = std::ranges::upper_bound(milestones_, last_epoch_) - milestones_.begin();  // bisect_right
    return scaled(base_lrs_, std::pow(gamma_, double(passed)));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("milestones", milestones_);
    io("gamma", gamma_, Bounds<double>{});
    if (io.reading()) std::ranges::sort(milestones_);  // the order get_lr's bisection needs
  }

 private:
  std::vector<std::int64_t> milestones_;
  double gamma_;
};

// [torch:optim/lr_scheduler.py ConstantLR]
//! `ConstantLR`'s options: PyTorch's arguments and defaults.
struct ConstantLROptions {
  double factor = 1.0 / 3;       //!< in [0, 1]
  std::int64_t total_iters = 5;  //!< steps at the reduced rate
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! The initial rates times `factor` until `total_iters` steps, then the initial rates.
class ConstantLR : public ExactScheduler {
 public:
  //! The options struct, `ConstantLROptions`.
  using Options = ConstantLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  ConstantLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), factor_(o.factor), total_(o.total_iters) {
    detail::require(o.factor >= 0 && o.factor <= 1,
                    "accel::ConstantLR: factor must be in [0, 1] (PyTorch's 'Constant multiplicative factor expected "
                    "to be between 0 and 1')");
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0) return scaled(current_lrs(), factor_);
    if (last_epoch_ != total_) return current_lrs();
    return scaled(current_lrs(), 1.0 / factor_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    // PyTorch: base_lr * (factor + (last_epoch >= total_iters) * (1 - factor)), the bool an int
    return scaled(base_lrs_, factor_ + double(last_epoch_ >= total_) * (1 - factor_));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("factor", factor_, Bounds<double>{0.0, 1.0});
    io("total_iters", total_);
  }

 private:
  double factor_;
  std::int64_t total_;
};

// [torch:optim/lr_scheduler.py ExponentialLR]
//! `ExponentialLR`'s options: PyTorch's arguments.
struct ExponentialLROptions {
  double gamma = 0.0;            //!< required
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! Each step multiplies the rates by `gamma` (PyTorch's `ExponentialLR`).
class ExponentialLR : public ExactScheduler {
 public:
  //! The options struct, `ExponentialLROptions`.
  using Options = ExponentialLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  ExponentialLR(torch::optim::Optimizer& opt, Options o) : ExactScheduler(opt, o.last_epoch), gamma_(o.gamma) {
    initial_step();
  }
  //! The positional spelling of earlier versions.
  ExponentialLR(torch::optim::Optimizer& opt, double gamma, std::int64_t last_epoch = -1)
      : ExponentialLR(opt, Options{.gamma = gamma, .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    if (is_initial_) return current_lrs();
    return scaled(current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return scaled(base_lrs_, std::pow(gamma_, double(last_epoch_)));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("gamma", gamma_, Bounds<double>{});
  }

 private:
  double gamma_;
};

// [torch:optim/lr_scheduler.py LinearLR]
//! `LinearLR`'s options: PyTorch's arguments and defaults.
struct LinearLROptions {
  double start_factor = 1.0 / 3;  //!< in (0, 1]
  double end_factor = 1.0;        //!< in [0, 1]
  std::int64_t total_iters = 5;   //!< steps from `start_factor` to `end_factor`
  std::int64_t last_epoch = -1;   //!< -1: a new schedule; k: resume at step k+1
};
//! The initial rates times a factor that goes linearly from `start_factor` to `end_factor` over `total_iters` steps,
//! then stays (PyTorch's `LinearLR`).
class LinearLR : public ExactScheduler {
 public:
  //! The options struct, `LinearLROptions`.
  using Options = LinearLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  LinearLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), start_(o.start_factor), end_(o.end_factor), total_(o.total_iters) {
    detail::require(start_ > 0 && start_ <= 1, "accel::LinearLR: start_factor must be in (0, 1]");
    detail::require(end_ >= 0 && end_ <= 1, "accel::LinearLR: end_factor must be in [0, 1]");
    initial_step();
  }
  //! The positional spellings of earlier versions (a template only so that `LinearLR(opt, {})` is the options form,
  //! PyTorch's defaults, not a `start_factor` of 0).
  explicit LinearLR(torch::optim::Optimizer& opt) : LinearLR(opt, Options{}) {}
  //! The positional spelling `LinearLR(opt, start_factor, end_factor, total_iters, last_epoch)`.
  template <class Start>
  requires std::is_arithmetic_v<Start> LinearLR(torch::optim::Optimizer& opt, Start start_factor,
                                                double end_factor = 1.0, std::int64_t total_iters = 5,
                                                std::int64_t last_epoch = -1)
      : LinearLR(opt, Options{.start_factor = double(start_factor),
                              .end_factor = end_factor,
                              .total_iters = total_iters,
                              .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0) return scaled(current_lrs(), start_);
    if (is_initial_ || last_epoch_ > total_) return current_lrs();
    // The same parenthesisation as PyTorch's: the factor first, then the product.
    const double f = 1.0 + (end_ - start_) / (double(total_) * start_ + double(last_epoch_ - 1) * (end_ - start_));
    return scaled(current_lrs(), f);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return scaled(base_lrs_, start_ + (end_ - start_) * double(std::min(total_, last_epoch_)) / double(total_));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("start_factor", start_, Bounds<double>{std::numeric_limits<double>::min(), 1.0});
    io("end_factor", end_, Bounds<double>{0.0, 1.0});
    io("total_iters", total_, Bounds<std::int64_t>{0});
  }

 private:
  double start_, end_;
  std::int64_t total_;
};

// [torch:optim/lr_scheduler.py PolynomialLR]
//! `PolynomialLR`'s options: PyTorch's arguments and defaults.
struct PolynomialLROptions {
  std::int64_t total_iters = 5;  //!< positive
  double power = 1.0;            //!< the polynomial's power
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! The initial rates times `(1 - t / total_iters)^power`, 0 from `total_iters` on.
class PolynomialLR : public ExactScheduler {
 public:
  //! The options struct, `PolynomialLROptions`.
  using Options = PolynomialLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  PolynomialLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), total_(o.total_iters), power_(o.power) {
    detail::require(total_ > 0, "accel::PolynomialLR: total_iters must be positive (PyTorch divides by it)");
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (is_initial_ || last_epoch_ > total_) return current_lrs();
    const double t = double(total_);
    const double f = std::pow((1.0 - double(last_epoch_) / t) / (1.0 - double(last_epoch_ - 1) / t), power_);
    return scaled(current_lrs(), f);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return scaled(base_lrs_, std::pow(1.0 - double(std::min(total_, last_epoch_)) / double(total_), power_));
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("total_iters", total_, Bounds<std::int64_t>{1});
    io("power", power_, Bounds<double>{});
  }

 private:
  std::int64_t total_;
  double power_;
};

// [torch:optim/lr_scheduler.py CosineAnnealingLR]
//! `CosineAnnealingLR`'s options: PyTorch's arguments and defaults.
struct CosineAnnealingLROptions {
  std::int64_t T_max = 0;        //!< required: positive  NOLINT(readability-identifier-naming): PyTorch's name
  double eta_min = 0.0;          //!< the lowest rate
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! The rates follow a cosine from the initial rates down to `eta_min` over `T_max` steps (PyTorch's
//! `CosineAnnealingLR`, its chainable recurrence; no restarts: past `T_max` the cosine goes on, back up).
class CosineAnnealingLR : public ExactScheduler {
 public:
  //! The options struct, `CosineAnnealingLROptions`.
  using Options = CosineAnnealingLROptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  CosineAnnealingLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), t_max_(o.T_max), eta_min_(o.eta_min) {
    detail::require(o.T_max > 0, "accel::CosineAnnealingLR: T_max must be positive");
    initial_step();
  }
  //! The positional spelling of earlier versions.
  CosineAnnealingLR(torch::optim::Optimizer& opt, std::int64_t T_max,  // NOLINT(readability-identifier-naming)
                    double eta_min = 0.0, std::int64_t last_epoch = -1)
      : CosineAnnealingLR(opt, Options{.T_max = T_max, .eta_min = eta_min, .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    constexpr double pi = std::numbers::pi;  // == math.pi
    auto lrs = current_lrs();
    const double e = double(last_epoch_), t = double(t_max_);
    if (is_initial_) return lrs;
    if (step_count_py_ == 1 && last_epoch_ > 0) {
      for (std::size_t i = 0; i < lrs.size(); ++i)
        lrs[i] = eta_min_ + (base_lrs_[i] - eta_min_) * (1 + std::cos(e * pi / t)) / 2;
    } else if ((last_epoch_ - 1 - t_max_) % (2 * t_max_) == 0) {  // divisibility: the sign of % does not matter
      for (std::size_t i = 0; i < lrs.size(); ++i)
        lrs[i] = lrs[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(pi / t)) / 2;
    } else {
      for (auto& lr : lrs)
        lr = (1 + std::cos(pi * e / t)) / (1 + std::cos(pi * (e - 1) / t)) * (lr - eta_min_) + eta_min_;
    }
    return lrs;
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    constexpr double pi = std::numbers::pi;
    std::vector<double> out;
    for (double b : base_lrs_)
      out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(pi * double(last_epoch_) / double(t_max_))) / 2);
    return out;
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    io("T_max", t_max_, Bounds<std::int64_t>{1, std::numeric_limits<std::int64_t>::max() / 2});
    io("eta_min", eta_min_, Bounds<double>{});
  }

 private:
  std::int64_t t_max_;
  double eta_min_;
};

// [torch:optim/lr_scheduler.py CosineAnnealingWarmRestarts]
//! `CosineAnnealingWarmRestarts`' options: PyTorch's arguments and defaults.
struct CosineAnnealingWarmRestartsOptions {
  std::int64_t T_0 = 0;          //!< required: the first period, positive  NOLINT(readability-identifier-naming)
  std::int64_t T_mult = 1;       //!< each period this many times the last, >= 1  NOLINT(readability-identifier-naming)
  double eta_min = 0.0;          //!< the lowest rate
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! A cosine from the initial rates to `eta_min` over `T_0` steps, then again from the initial rates over
//! `T_0 * T_mult`, ... (SGDR). Stepped without an epoch, as here, PyTorch counts `T_cur` up and restarts it.
class CosineAnnealingWarmRestarts : public ExactScheduler {
 public:
  //! The options struct, `CosineAnnealingWarmRestartsOptions`.
  using Options = CosineAnnealingWarmRestartsOptions;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch),
        t_0_(o.T_0),
        t_i_(o.T_0),
        t_mult_(o.T_mult),
        eta_min_(o.eta_min),
        t_cur_(o.last_epoch) {
    detail::require(o.T_0 > 0, "accel::CosineAnnealingWarmRestarts: T_0 must be a positive integer, it is " +
                                   std::to_string(o.T_0));
    detail::require(o.T_mult >= 1, "accel::CosineAnnealingWarmRestarts: T_mult must be an integer >= 1, it is " +
                                       std::to_string(o.T_mult));
    initial_step();
  }
  //! Steps since the last restart (PyTorch's `T_cur`).
  [[nodiscard]] std::int64_t T_cur() const noexcept { return t_cur_; }  // NOLINT(readability-identifier-naming)
  //! The current period (PyTorch's `T_i`).
  [[nodiscard]] std::int64_t T_i() const noexcept { return t_i_; }  // NOLINT(readability-identifier-naming)

 protected:
  std::vector<double> get_lr() override {
    constexpr double pi = std::numbers::pi;
    std::vector<double> out;
    for (double b : base_lrs_)
      out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(pi * double(t_cur_) / double(t_i_))) / 2);
    return out;
  }
  // [torch:optim/lr_scheduler.py CosineAnnealingWarmRestarts.step] (its own step: `_step_count` stays 0)
  //! PyTorch's own `step()` of this scheduler: `T_cur` counts up and restarts at `T_i`, which then grows by `T_mult`.
  void advance() override {
    if (last_epoch_ < 0) {  // step(epoch = 0)
      t_i_ = t_0_;
      t_cur_ = 0;
      last_epoch_ = 0;
    } else {
      last_epoch_ = last_epoch_ + 1;
      t_cur_ = t_cur_ + 1;
      if (t_cur_ >= t_i_) {
        t_cur_ = t_cur_ % t_i_;
        t_i_ = t_i_ * t_mult_;
      }
    }
    auto values = get_lr();
    detail::set_group_lrs(opt_, values);
    last_lr_ = std::move(values);
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    constexpr auto positive = Bounds<std::int64_t>{1};
    io("T_0", t_0_, positive);
    io("T_i", t_i_, positive);
    io("T_mult", t_mult_, positive);
    io("eta_min", eta_min_, Bounds<double>{});
    io("T_cur", t_cur_, Bounds<std::int64_t>{-1});
  }

 private:
  std::int64_t t_0_, t_i_, t_mult_;
  double eta_min_;
  std::int64_t t_cur_;
};

// [torch:optim/lr_scheduler.py CyclicLR]
//! `CyclicLR`'s policy (PyTorch's `mode`): a constant triangle, a triangle halved each cycle, or one scaled by
//! `gamma^iteration`.
enum class CyclicMode { triangular, triangular2, exp_range };
//! `CyclicLR`'s options: PyTorch's arguments and defaults (no custom `scale_fn`).
struct CyclicLROptions {
  std::vector<double> base_lr;       //!< required: one value, or one per group (the groups' rates are set to it)
  std::vector<double> max_lr;        //!< required: one value, or one per group
  std::int64_t step_size_up = 2000;  //!< steps from `base_lr` up to `max_lr`
  std::optional<std::int64_t> step_size_down;  //!< step_size_up when unset
  CyclicMode mode = CyclicMode::triangular;    //!< the cycle's shape
  double gamma = 1.0;                          //!< exp_range's decay per iteration
  bool cycle_momentum = true;                  //!< cycle the momentum (or beta1) inversely
  std::vector<double> base_momentum{0.8};      //!< one value, or one per group
  std::vector<double> max_momentum{0.9};       //!< one value, or one per group
  std::int64_t last_epoch = -1;                //!< -1: a new schedule; k: resume at step k+1
};
//! The rates cycle between `base_lr` and `max_lr` (and the momentum, or Adam's beta1, between `max_momentum` and
//! `base_momentum`), up over `step_size_up` steps and down over `step_size_down`; triangular2 halves the height each
//! cycle, exp_range multiplies it by `gamma^iteration`. PyTorch's custom `scale_fn` is not offered.
class CyclicLR : public ExactScheduler {
 public:
  //! The options struct, `CyclicLROptions`.
  using Options = CyclicLROptions;
  //! Sets the groups' rates to `base_lr` (and the momentum to `max_momentum`) and takes PyTorch's initial step.
  CyclicLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(start_at_base(opt, o), o.last_epoch), o_(std::move(o)) {
    const auto n = opt.param_groups().size();
    detail::require(o_.step_size_up > 0 && o_.step_size_down.value_or(1) >= 0,
                    "accel::CyclicLR: step_size_up must be positive and step_size_down not negative");
    max_lrs_ = detail::per_group(o_.max_lr, n, "max_lr");
    if (o_.cycle_momentum) {
      detail::require(detail::momentum_slot(opt.defaults()) != nullptr,
                      "accel::CyclicLR: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, "
                      "Adam, AdamW); pass cycle_momentum = false");
      base_m_ = detail::per_group(o_.base_momentum, n, "base_momentum");
      max_m_ = detail::per_group(o_.max_momentum, n, "max_momentum");
      if (o_.last_epoch == -1)
        for (std::size_t i = 0; i < n; ++i) *detail::momentum_slot(opt.param_groups()[i].options()) = max_m_[i];
    }
    const double up = double(o_.step_size_up);
    const double down = o_.step_size_down ? double(*o_.step_size_down) : up;
    total_size_ = up + down;
    step_ratio_ = up / total_size_;
    initial_step();
    base_lrs_ = detail::per_group(o_.base_lr, n, "base_lr");  // after the initial step, as PyTorch's __init__
  }

 protected:
  std::vector<double> get_lr() override {
    const double e = double(last_epoch_);
    const double cycle = std::floor(1 + e / total_size_);
    const double x = 1.0 + e / total_size_ - cycle;
    const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
    const double scale = scale_fn(o_.mode == CyclicMode::exp_range ? e : cycle);
    std::vector<double> lrs;
    for (std::size_t i = 0; i < base_lrs_.size(); ++i) {
      const double base_height = (max_lrs_[i] - base_lrs_[i]) * scale_factor;
      lrs.push_back(base_lrs_[i] + base_height * scale);
    }
    if (o_.cycle_momentum) {
      auto& groups = opt_.param_groups();
      for (std::size_t i = 0; i < groups.size(); ++i) {
        const double base_height = (max_m_[i] - base_m_[i]) * scale_factor;
        *detail::momentum_slot(groups[i].options()) = max_m_[i] - base_height * scale;
      }
    }
    return lrs;
  }
  void fields(StateIO& io) override {
    ExactScheduler::fields(io);
    const auto groups = opt_.param_groups().size();
    io.per_group("max_lrs", max_lrs_, groups);
    io("total_size", total_size_, Bounds<double>{1.0});
    io("step_ratio", step_ratio_, Bounds<double>{std::numeric_limits<double>::min(), 1.0});
    std::int64_t mode = std::int64_t(o_.mode);
    io("mode", mode, Bounds<std::int64_t>{0, 2});
    o_.mode = CyclicMode(mode);
    io("gamma", o_.gamma, Bounds<double>{});
    io("cycle_momentum", o_.cycle_momentum);
    if (io.reading() && o_.cycle_momentum && !detail::momentum_slot(opt_.defaults()))
      throw InvalidArgument("scheduler state 'cycle_momentum' is true, and this optimizer has no momentum or beta1");
    io.exactly("base_momentums", base_m_, o_.cycle_momentum ? groups : 0);
    io.exactly("max_momentums", max_m_, o_.cycle_momentum ? groups : 0);
  }

 private:
  //! PyTorch's `__init__` sets the groups' rates to `base_lr` before `LRScheduler.__init__` reads `initial_lr`.
  static torch::optim::Optimizer& start_at_base(torch::optim::Optimizer& opt, const Options& o) {
    auto base = detail::per_group(o.base_lr, opt.param_groups().size(), "base_lr");
    if (o.last_epoch == -1) detail::set_group_lrs(opt, base);
    return opt;
  }
  [[nodiscard]] double scale_fn(double x) const {
    switch (o_.mode) {
      case CyclicMode::triangular:
        return 1.0;
      case CyclicMode::triangular2:
        return 1 / std::pow(2.0, x - 1);
      case CyclicMode::exp_range:
        return std::pow(o_.gamma, x);
    }
    return 1.0;
  }

  Options o_;
  std::vector<double> max_lrs_, base_m_, max_m_;
  double total_size_ = 0, step_ratio_ = 0;
};

//! One function of the step per parameter group (a single function serves every group).
struct LrLambdas : std::vector<std::function<double(std::int64_t)>> {
  //! A function of the step count returning a factor.
  using Fn = std::function<double(std::int64_t)>;
  using std::vector<Fn>::vector;
  //! No function (the options' default; `lr_lambda` is required).
  LrLambdas() = default;
  //! One function for every group (so that `.lr_lambda = fn` reads as PyTorch's `lr_lambda=fn`).
  template <class F>
  requires std::is_invocable_r_v<double, F&, std::int64_t> &&
      (!std::same_as<std::remove_cvref_t<F>, LrLambdas>)LrLambdas(F f)
      : std::vector<Fn>{Fn(std::move(f))} {}  // NOLINT(google-explicit-constructor): `.lr_lambda = fn`
  //! One per group: a single function repeated, or exactly one per group.
  [[nodiscard]] std::vector<Fn> per_group(std::size_t groups, const char* who) const {
    if (size() == 1) return std::vector<Fn>(groups, front());
    detail::require(size() == groups, std::string(who) + ": expected " + std::to_string(groups) +
                                          " functions (one per group), got " + std::to_string(size()));
    return *this;
  }
};

// [torch:optim/lr_scheduler.py LambdaLR]
//! `LambdaLR`'s options: PyTorch's arguments.
struct LambdaLROptions {
  LrLambdas lr_lambda;           //!< required
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! Each group's rate is its initial rate times `lr_lambda(last_epoch)`. The functions are not state (PyTorch saves
//! only callable objects' attributes): a resumed job builds the scheduler with the same functions and `load`s.
class LambdaLR : public ExactScheduler {
 public:
  //! The options struct, `LambdaLROptions`.
  using Options = LambdaLROptions;
  //! A function of the step count returning a factor (`LrLambdas::Fn`).
  using Fn = LrLambdas::Fn;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  LambdaLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch), fns_(o.lr_lambda.per_group(opt.param_groups().size(), "accel::LambdaLR")) {
    initial_step();
  }
  //! The positional spellings of earlier versions: one function for every group, or one per group (templates only
  //! so that a braced `{...}` second argument alone is the options form).
  template <class F>
  requires std::is_invocable_r_v<double, F&, std::int64_t> LambdaLR(torch::optim::Optimizer& opt, F fn,
                                                                    std::int64_t last_epoch = -1)
      : LambdaLR(opt, Options{.lr_lambda = Fn(std::move(fn)), .last_epoch = last_epoch}) {}
  //! The positional spelling with one function per group (exactly one per group).
  template <class Fns = std::vector<Fn>>
  requires std::same_as<Fns, std::vector<Fn>> LambdaLR(torch::optim::Optimizer& opt, Fns fns,
                                                       std::int64_t last_epoch = -1)
      : LambdaLR(opt, Options{.lr_lambda = one_per_group(opt, fns), .last_epoch = last_epoch}) {}

 protected:
  std::vector<double> get_lr() override {
    std::vector<double> out;
    for (std::size_t i = 0; i < base_lrs_.size(); ++i) out.push_back(base_lrs_[i] * fns_[i](last_epoch_));
    return out;
  }

 private:
  //! The positional list of functions: exactly one per group, as it always was (one for a group of two is refused).
  static LrLambdas one_per_group(const torch::optim::Optimizer& opt, const std::vector<Fn>& fns) {
    detail::require(fns.size() == opt.param_groups().size(),
                    "accel::LambdaLR: expected " + std::to_string(opt.param_groups().size()) +
                        " functions (one per group), got " + std::to_string(fns.size()));
    return LrLambdas(fns.begin(), fns.end());
  }
  std::vector<Fn> fns_;
};

// [torch:optim/lr_scheduler.py MultiplicativeLR]
//! `MultiplicativeLR`'s options: PyTorch's arguments.
struct MultiplicativeLROptions {
  LrLambdas lr_lambda;           //!< required
  std::int64_t last_epoch = -1;  //!< -1: a new schedule; k: resume at step k+1
};
//! Each step multiplies each group's current rate by `lr_lambda(last_epoch)`. The functions are not state.
class MultiplicativeLR : public ExactScheduler {
 public:
  //! The options struct, `MultiplicativeLROptions`.
  using Options = MultiplicativeLROptions;
  //! A function of the step count returning a factor (`LrLambdas::Fn`).
  using Fn = LrLambdas::Fn;
  //! Takes the optimizer's current rates as initial rates and takes PyTorch's initial step.
  MultiplicativeLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, o.last_epoch),
        fns_(o.lr_lambda.per_group(opt.param_groups().size(), "accel::MultiplicativeLR")) {
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    auto lrs = current_lrs();
    if (is_initial_) return lrs;
    for (std::size_t i = 0; i < lrs.size(); ++i) lrs[i] = lrs[i] * fns_[i](last_epoch_);
    return lrs;
  }

 private:
  std::vector<Fn> fns_;
};

// [torch:optim/lr_scheduler.py SequentialLR]
//! `SequentialLR`'s options: PyTorch's arguments.
struct SequentialLROptions {
  std::vector<std::shared_ptr<ExactScheduler>> schedulers;  //!< run in turn, all built on `opt`
  std::vector<std::int64_t> milestones;                     //!< one fewer than schedulers
};
//! The schedulers run one after the other, switching at `milestones`. At its milestone a scheduler restarts from
//! epoch 0 through its closed form where PyTorch has one (StepLR, MultiStepLR, ConstantLR, ExponentialLR, LinearLR,
//! PolynomialLR, CosineAnnealingLR) and its `get_lr()` otherwise; then it steps as usual. Build every scheduler on
//! `opt` first, as in PyTorch: each built scheduler has stepped once, which this constructor undoes.
class SequentialLR : public ExactScheduler {
 public:
  //! The options struct, `SequentialLROptions`.
  using Options = SequentialLROptions;
  //! Undoes the initial step each scheduler took when built, then takes the first one's.
  SequentialLR(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, Bare{}), subs_(std::move(o.schedulers)), milestones_(std::move(o.milestones)) {
    detail::require(!subs_.empty(), "accel::SequentialLR expects at least one scheduler, but got no scheduler");
    for (std::size_t i = 0; i < subs_.size(); ++i)
      detail::require(subs_[i] && &subs_[i]->optimizer() == &opt,
                      "accel::SequentialLR expects all schedulers to belong to the same optimizer; scheduler " +
                          std::to_string(i) + " does not");
    detail::require(milestones_.size() + 1 == subs_.size(),
                    "accel::SequentialLR expects one milestone fewer than schedulers, got " +
                        std::to_string(subs_.size()) + " schedulers and " + std::to_string(milestones_.size()) +
                        " milestones");
    initial_ = detail::InitialLrs::find(opt);
    detail::require(initial_ != nullptr, "accel::SequentialLR: the optimizer's initial rates are unknown");
    last_epoch_ = 0;
    detail::set_group_lrs(opt, *initial_);
    for (auto& s : subs_) s->undo_initial_step();
    subs_[index(0)]->initial_step();
    last_lr_ = subs_[index(0)]->get_last_lr();
  }
  //! The positional spelling of earlier versions.
  SequentialLR(torch::optim::Optimizer& opt, std::vector<std::shared_ptr<ExactScheduler>> schedulers,
               std::vector<std::int64_t> milestones)
      : SequentialLR(opt, Options{.schedulers = std::move(schedulers), .milestones = std::move(milestones)}) {}
  //! The schedulers it runs in turn.
  [[nodiscard]] const std::vector<std::shared_ptr<ExactScheduler>>& schedulers() const noexcept { return subs_; }

 protected:
  //! Its own epoch, milestones and last rates, and each scheduler's state (PyTorch's `_schedulers`).
  void fields(StateIO& io) override {
    io("last_epoch", last_epoch_, Bounds<std::int64_t>{0});
    io.per_group("last_lr", last_lr_, opt_.param_groups().size());
    io.exactly("milestones", milestones_, subs_.size() - 1);
    for (std::size_t i = 0; i < subs_.size(); ++i) io.nested("scheduler_" + std::to_string(i), *subs_[i]);
  }
  //! Steps the scheduler of the current milestone interval; at a milestone, restarts the next one from epoch 0.
  void advance() override {
    ++last_epoch_;
    const auto i = index(last_epoch_);
    auto& s = *subs_[i];
    if (i > 0 && milestones_[i - 1] == last_epoch_)
      s.update_lr(0);
    else
      s.step();
    last_lr_ = s.get_last_lr();
  }
  std::vector<double> get_lr() override {
    throw InvalidArgument(
        "accel::SequentialLR has no get_lr() (PyTorch's raises NotImplementedError): a "
        "SequentialLR cannot follow another scheduler in a SequentialLR");
  }
  void undo_initial_step() override {
    for (auto& s : subs_) s->undo_initial_step();
  }

 private:
  [[nodiscard]] std::size_t index(std::int64_t epoch) const {  // bisect_right
    return std::size_t(std::ranges::upper_bound(milestones_, epoch) - milestones_.begin());
  }
  std::vector<std::shared_ptr<ExactScheduler>> subs_;
  std::vector<std::int64_t> milestones_;
};

// [torch:optim/lr_scheduler.py ChainedScheduler]
//! `ChainedScheduler`'s options (PyTorch's arguments).
struct ChainedSchedulerOptions {
  std::vector<std::shared_ptr<ExactScheduler>> schedulers;  //!< at least one, all of `opt`
};
//! Every step steps each scheduler in turn (their multiplicative effects compound). As PyTorch's, it takes no
//! initial step of its own; `last_epoch()` counts its steps (PyTorch's has no `last_epoch`).
class ChainedScheduler : public ExactScheduler {
 public:
  //! The options struct, `ChainedSchedulerOptions`.
  using Options = ChainedSchedulerOptions;
  //! Takes no initial step (PyTorch's takes none): each scheduler took its own when built.
  ChainedScheduler(torch::optim::Optimizer& opt, Options o)
      : ExactScheduler(opt, Bare{}), subs_(std::move(o.schedulers)) {
    detail::require(!subs_.empty(),
                    "accel::ChainedScheduler expects at least one scheduler to be chained, but got "
                    "no scheduler");
    for (std::size_t i = 0; i < subs_.size(); ++i)
      detail::require(subs_[i] && &subs_[i]->optimizer() == &opt,
                      "accel::ChainedScheduler expects all schedulers to belong to the same optimizer; scheduler " +
                          std::to_string(i) + " does not");
    last_epoch_ = 0;
    last_lr_ = current_lrs();
  }
  //! The schedulers it steps.
  [[nodiscard]] const std::vector<std::shared_ptr<ExactScheduler>>& schedulers() const noexcept { return subs_; }

 protected:
  void fields(StateIO& io) override {
    io("last_epoch", last_epoch_, Bounds<std::int64_t>{0});
    io.per_group("last_lr", last_lr_, opt_.param_groups().size());
    for (std::size_t i = 0; i < subs_.size(); ++i) io.nested("scheduler_" + std::to_string(i), *subs_[i]);
  }
  //! Steps every scheduler in turn.
  void advance() override {
    for (auto& s : subs_) s->step();
    ++last_epoch_;
    last_lr_ = current_lrs();
  }
  std::vector<double> get_lr() override {
    throw InvalidArgument("accel::ChainedScheduler has no get_lr(): it steps the schedulers it chains");
  }
  void undo_initial_step() override {
    throw InvalidArgument("accel::ChainedScheduler cannot be part of a SequentialLR");
  }

 private:
  std::vector<std::shared_ptr<ExactScheduler>> subs_;
};

// ---- transformers' schedules (transformers/optimization.py), as the LambdaLRs transformers returns ----------

//! `constant_schedule_with_warmup`'s options (transformers' arguments).
struct ConstantScheduleWithWarmupOptions {
  std::int64_t num_warmup_steps = 0;  //!< the rate climbs linearly from 0 over these steps
  std::int64_t last_epoch = -1;       //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_constant_schedule_with_warmup]
//! Linear warmup from 0 over `num_warmup_steps`, then the initial rate.
inline std::shared_ptr<LambdaLR> constant_schedule_with_warmup(torch::optim::Optimizer& opt,
                                                               ConstantScheduleWithWarmupOptions o) {
  return std::make_shared<LambdaLR>(opt, LambdaLROptions{.lr_lambda =
                                                             [w = o.num_warmup_steps](std::int64_t step) {
                                                               if (step < w)
                                                                 return double(step) / std::max(1.0, double(w));
                                                               return 1.0;
                                                             },
                                                         .last_epoch = o.last_epoch});
}
//! The positional spelling of earlier versions.
inline std::shared_ptr<LambdaLR> constant_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                               std::int64_t last_epoch = -1) {
  return constant_schedule_with_warmup(opt, {.num_warmup_steps = warmup, .last_epoch = last_epoch});
}

//! `linear_schedule_with_warmup`'s options (transformers' arguments).
struct LinearScheduleWithWarmupOptions {
  std::int64_t num_warmup_steps = 0;    //!< the rate climbs linearly from 0 over these steps
  std::int64_t num_training_steps = 0;  //!< required
  std::int64_t last_epoch = -1;         //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_linear_schedule_with_warmup]
//! Linear warmup from 0 over `num_warmup_steps`, then a linear decay to 0 at `num_training_steps`.
inline std::shared_ptr<LambdaLR> linear_schedule_with_warmup(torch::optim::Optimizer& opt,
                                                             LinearScheduleWithWarmupOptions o) {
  return std::make_shared<LambdaLR>(
      opt, LambdaLROptions{.lr_lambda =
                               [warmup = o.num_warmup_steps, total = o.num_training_steps](std::int64_t step) {
                                 if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
                                 return std::max(
                                     0.0, double(total - step) / double(std::max<std::int64_t>(1, total - warmup)));
                               },
                           .last_epoch = o.last_epoch});
}
//! The positional spelling of earlier versions.
inline std::shared_ptr<LambdaLR> linear_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                             std::int64_t total, std::int64_t last_epoch = -1) {
  return linear_schedule_with_warmup(
      opt, {.num_warmup_steps = warmup, .num_training_steps = total, .last_epoch = last_epoch});
}

//! `cosine_schedule_with_warmup`'s options (transformers' arguments and defaults).
struct CosineScheduleWithWarmupOptions {
  std::int64_t num_warmup_steps = 0;    //!< the rate climbs linearly from 0 over these steps
  std::int64_t num_training_steps = 0;  //!< required
  double num_cycles = 0.5;              //!< 0.5: one half-wave from the initial rate to 0
  std::int64_t last_epoch = -1;         //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_cosine_schedule_with_warmup]
//! Linear warmup from 0 over `num_warmup_steps`, then `num_cycles` cosine waves down to 0 at `num_training_steps`.
inline std::shared_ptr<LambdaLR> cosine_schedule_with_warmup(torch::optim::Optimizer& opt,
                                                             CosineScheduleWithWarmupOptions o) {
  return std::make_shared<LambdaLR>(
      opt, LambdaLROptions{.lr_lambda =
                               [warmup = o.num_warmup_steps, total = o.num_training_steps,
                                num_cycles = o.num_cycles](std::int64_t step) {
                                 if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
                                 const double progress =
                                     double(step - warmup) / double(std::max<std::int64_t>(1, total - warmup));
                                 // transformers' default min_lr_rate, kept so that the arithmetic is its own
                                 const double min_lr_rate = 0.0;
                                 double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress));
                                 factor = factor * (1 - min_lr_rate) + min_lr_rate;
                                 return std::max(0.0, factor);
                               },
                           .last_epoch = o.last_epoch});
}
//! The positional spelling of earlier versions.
inline std::shared_ptr<LambdaLR> cosine_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                             std::int64_t total, double num_cycles = 0.5,
                                                             std::int64_t last_epoch = -1) {
  return cosine_schedule_with_warmup(
      opt,
      {.num_warmup_steps = warmup, .num_training_steps = total, .num_cycles = num_cycles, .last_epoch = last_epoch});
}

//! `cosine_with_hard_restarts_schedule_with_warmup`'s options (transformers' arguments and defaults).
struct CosineWithHardRestartsScheduleWithWarmupOptions {
  std::int64_t num_warmup_steps = 0;    //!< the rate climbs linearly from 0 over these steps
  std::int64_t num_training_steps = 0;  //!< required
  std::int64_t num_cycles = 1;          //!< hard restarts
  std::int64_t last_epoch = -1;         //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_cosine_with_hard_restarts_schedule_with_warmup]
//! Linear warmup from 0 over `num_warmup_steps`, then `num_cycles` cosine half-waves from the initial rate to 0,
//! each restarting at the initial rate; 0 from `num_training_steps` on.
inline std::shared_ptr<LambdaLR> cosine_with_hard_restarts_schedule_with_warmup(
    torch::optim::Optimizer& opt, CosineWithHardRestartsScheduleWithWarmupOptions o) {
  return std::make_shared<LambdaLR>(
      opt, LambdaLROptions{
               .lr_lambda =
                   [warmup = o.num_warmup_steps, total = o.num_training_steps,
                    num_cycles = o.num_cycles](std::int64_t step) {
                     if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
                     const double progress = double(step - warmup) / double(std::max<std::int64_t>(1, total - warmup));
                     if (progress >= 1.0) return 0.0;
                     // Python's float % 1.0: fmod for the non-negative operands here
                     return std::max(
                         0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * std::fmod(double(num_cycles) * progress, 1.0))));
                   },
               .last_epoch = o.last_epoch});
}

//! `polynomial_decay_schedule_with_warmup`'s options (transformers' arguments and defaults).
struct PolynomialDecayScheduleWithWarmupOptions {
  std::int64_t num_warmup_steps = 0;    //!< the rate climbs linearly from 0 over these steps
  std::int64_t num_training_steps = 0;  //!< required
  double lr_end = 1e-7;                 //!< below the optimizer's default rate
  double power = 1.0;                   //!< the decay's power
  std::int64_t last_epoch = -1;         //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_polynomial_decay_schedule_with_warmup]
//! Linear warmup from 0 over `num_warmup_steps`, then a polynomial decay from the optimizer's *default* rate
//! (`optimizer.defaults["lr"]`, as in transformers) to `lr_end` at `num_training_steps`, as a factor of each group's
//! initial rate.
inline std::shared_ptr<LambdaLR> polynomial_decay_schedule_with_warmup(torch::optim::Optimizer& opt,
                                                                       PolynomialDecayScheduleWithWarmupOptions o) {
  const double lr_init = opt.defaults().get_lr();
  detail::require(lr_init > o.lr_end, "accel::polynomial_decay_schedule_with_warmup: lr_end (" +
                                          std::to_string(o.lr_end) + ") must be smaller than the initial lr (" +
                                          std::to_string(lr_init) + ")");
  return std::make_shared<LambdaLR>(
      opt, LambdaLROptions{.lr_lambda =
                               [warmup = o.num_warmup_steps, total = o.num_training_steps, lr_end = o.lr_end,
                                power = o.power, lr_init](std::int64_t step) {
                                 if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
                                 if (step > total) return lr_end / lr_init;  // as LambdaLR multiplies by lr
                                 const double lr_range = lr_init - lr_end;
                                 const auto decay_steps = total - warmup;
                                 const double pct_remaining = 1 - double(step - warmup) / double(decay_steps);
                                 const double decay = lr_range * std::pow(pct_remaining, power) + lr_end;
                                 return decay / lr_init;  // as LambdaLR multiplies by lr
                               },
                           .last_epoch = o.last_epoch});
}

//! `inverse_sqrt_schedule`'s options (transformers' arguments and defaults).
struct InverseSqrtScheduleOptions {
  std::int64_t num_warmup_steps = 0;      //!< the rate climbs linearly from 0 over these steps
  std::optional<std::int64_t> timescale;  //!< unset: num_warmup_steps, or 10'000 when that is 0
  std::int64_t last_epoch = -1;           //!< -1: a new schedule; k: resume at step k+1
};
// [transformers:optimization.py get_inverse_sqrt_schedule]
//! Linear warmup from 0 over `num_warmup_steps`, then the initial rate times `1 / sqrt((step + shift) / timescale)`
//! (`shift = timescale - num_warmup_steps`).
inline std::shared_ptr<LambdaLR> inverse_sqrt_schedule(torch::optim::Optimizer& opt, InverseSqrtScheduleOptions o) {
  const std::int64_t timescale = o.timescale ? *o.timescale : (o.num_warmup_steps != 0 ? o.num_warmup_steps : 10'000);
  return std::make_shared<LambdaLR>(
      opt, LambdaLROptions{.lr_lambda =
                               [warmup = o.num_warmup_steps, timescale](std::int64_t step) {
                                 if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
                                 const std::int64_t shift = timescale - warmup;
                                 return 1.0 / std::sqrt(double(step + shift) / double(timescale));
                               },
                           .last_epoch = o.last_epoch});
}

// What Accelerator::prepare asks of a scheduler (TorchScheduler, optim/accelerated.hpp).
static_assert(std::derived_from<ExactScheduler, torch::optim::LRScheduler>);
static_assert(std::derived_from<ReduceLROnPlateau, torch::optim::LRScheduler>);

}  // namespace accel
