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
//! | accel                               | PyTorch / transformers                                        |
//! |-------------------------------------|---------------------------------------------------------------|
//! | `StepLR(opt, step_size, gamma)`     | `lr_scheduler.StepLR`                                         |
//! | `MultiStepLR(opt, milestones, gamma)` | `lr_scheduler.MultiStepLR` (a repeated milestone decays by gamma^count) |
//! | `ExponentialLR(opt, gamma)`         | `lr_scheduler.ExponentialLR`                                  |
//! | `LinearLR(opt, start, end, total_iters)` | `lr_scheduler.LinearLR`                                  |
//! | `CosineAnnealingLR(opt, T_max, eta_min)` | `lr_scheduler.CosineAnnealingLR`                         |
//! | `OneCycleLR(opt, max_lr, {...})`    | `lr_scheduler.OneCycleLR`: cos/linear, `three_phase`, `cycle_momentum`
//! (SGD/RMSprop momentum, Adam/AdamW beta1) | | `LambdaLR(opt, fn)` / `LambdaLR(opt, {fn0, fn1})` |
//! `lr_scheduler.LambdaLR`                         | | `SequentialLR(opt, {s0, s1}, milestones)` |
//! `lr_scheduler.SequentialLR` (a later scheduler restarts at its milestone from its closed form) | |
//! `ReduceLROnPlateau(opt, {...})`, `step(metric)` | `lr_scheduler.ReduceLROnPlateau`                    | |
//! `linear_schedule_with_warmup(opt, warmup, total)` | `transformers.get_linear_schedule_with_warmup`    | |
//! `cosine_schedule_with_warmup(opt, warmup, total, cycles)` | `transformers.get_cosine_schedule_with_warmup` | |
//! `constant_schedule_with_warmup(opt, warmup)` | `transformers.get_constant_schedule_with_warmup`       |
//!
//! Each derives from `torch::optim::LRScheduler` (so `Accelerator::prepare` takes a `std::shared_ptr` of it as it
//! takes LibTorch's), and `save`/`load` its whole state as PyTorch's `state_dict` does; `save_state` uses them. The
//! rates themselves live in the optimizer's parameter groups, which the checkpoint saves with the optimizer.
//!
//! ```cpp
//! auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(3e-4));
//! auto [model, opt, sched] = acc.prepare(net, adamw, accel::linear_schedule_with_warmup(*adamw, 100, 2000));
//! ```

#include <accel/detail/linkage.hpp>
#include <accel/optim/exact_scheduler.hpp>
#include <accel/optim/one_cycle.hpp>
#include <accel/optim/plateau.hpp>

namespace accel {

// [torch:optim/lr_scheduler.py StepLR]
class StepLR : public ExactScheduler {
 public:
  StepLR(torch::optim::Optimizer& opt, std::int64_t step_size, double gamma = 0.1, std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), step_size_(step_size), gamma_(gamma) {
    detail::require(step_size > 0, "accel::StepLR: step_size must be positive");
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return get_current_lrs();
    return detail::scaled(get_current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return detail::scaled(base_lrs_, std::pow(gamma_, double(last_epoch_ / step_size_)));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("step_size", step_size_, detail::Bounds<std::int64_t>{1});
    io("gamma", gamma_, detail::Bounds<double>{});
  }

 private:
  std::int64_t step_size_;
  double gamma_;
};

// [torch:optim/lr_scheduler.py MultiStepLR]
class MultiStepLR : public ExactScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& opt, std::vector<std::int64_t> milestones, double gamma = 0.1,
              std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), milestones_(std::move(milestones)), gamma_(gamma) {
    std::ranges::sort(milestones_);  // PyTorch keeps a Counter: order does not matter, repeats do
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    const auto n = std::ranges::count(milestones_, last_epoch_);
    if (n == 0) return get_current_lrs();
    return detail::scaled(get_current_lrs(), std::pow(gamma_, double(n)));
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    const auto passed = std::ranges::upper_bound(milestones_, last_epoch_) - milestones_.begin();  // bisect_right
    return detail::scaled(base_lrs_, std::pow(gamma_, double(passed)));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("milestones", milestones_);
    io("gamma", gamma_, detail::Bounds<double>{});
    if (io.reading()) std::ranges::sort(milestones_);  // the order get_lr's bisection needs
  }

 private:
  std::vector<std::int64_t> milestones_;
  double gamma_;
};

// [torch:optim/lr_scheduler.py ExponentialLR]
class ExponentialLR : public ExactScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& opt, double gamma, std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), gamma_(gamma) {
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (is_initial_) return get_current_lrs();
    return detail::scaled(get_current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return detail::scaled(base_lrs_, std::pow(gamma_, double(last_epoch_)));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("gamma", gamma_, detail::Bounds<double>{});
  }

 private:
  double gamma_;
};

// [torch:optim/lr_scheduler.py LinearLR]
class LinearLR : public ExactScheduler {
 public:
  LinearLR(torch::optim::Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0,
           std::int64_t total_iters = 5, std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), start_(start_factor), end_(end_factor), total_(total_iters) {
    detail::require(start_factor > 0 && start_factor <= 1, "accel::LinearLR: start_factor must be in (0, 1]");
    detail::require(end_factor >= 0 && end_factor <= 1, "accel::LinearLR: end_factor must be in [0, 1]");
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0) return detail::scaled(get_current_lrs(), start_);
    if (is_initial_ || last_epoch_ > total_) return get_current_lrs();
    // The same parenthesisation as PyTorch's: the factor first, then the product.
    const double f = 1.0 + (end_ - start_) / (double(total_) * start_ + double(last_epoch_ - 1) * (end_ - start_));
    return detail::scaled(get_current_lrs(), f);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return detail::scaled(base_lrs_, start_ + (end_ - start_) * double(std::min(total_, last_epoch_)) / double(total_));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("start_factor", start_, detail::Bounds<double>{std::numeric_limits<double>::min(), 1.0});
    io("end_factor", end_, detail::Bounds<double>{0.0, 1.0});
    io("total_iters", total_, detail::Bounds<std::int64_t>{0});
  }

 private:
  double start_, end_;
  std::int64_t total_;
};

// [torch:optim/lr_scheduler.py CosineAnnealingLR]
class CosineAnnealingLR : public ExactScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& opt, std::int64_t T_max, double eta_min = 0.0,
                    std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), t_max_(T_max), eta_min_(eta_min) {
    detail::require(T_max > 0, "accel::CosineAnnealingLR: T_max must be positive");
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    constexpr double pi = std::numbers::pi;  // == math.pi
    auto lrs = get_current_lrs();
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
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("T_max", t_max_, detail::Bounds<std::int64_t>{1, std::numeric_limits<std::int64_t>::max() / 2});
    io("eta_min", eta_min_, detail::Bounds<double>{});
  }

 private:
  std::int64_t t_max_;
  double eta_min_;
};

// [torch:optim/lr_scheduler.py LambdaLR]
//! Each group's rate is its initial rate times `fn(last_epoch)`. The functions are not state (PyTorch saves only
//! callable objects' attributes): a resumed job builds the scheduler with the same functions and `load`s.
class LambdaLR : public ExactScheduler {
 public:
  using Fn = std::function<double(std::int64_t)>;
  //! One function for every group.
  LambdaLR(torch::optim::Optimizer& opt, Fn fn, std::int64_t last_epoch = -1)
      : LambdaLR(opt, std::vector<Fn>(opt.param_groups().size(), fn), last_epoch) {}
  //! One function per group.
  LambdaLR(torch::optim::Optimizer& opt, std::vector<Fn> fns, std::int64_t last_epoch = -1)
      : ExactScheduler(opt, last_epoch), fns_(std::move(fns)) {
    detail::require(fns_.size() == opt.param_groups().size(),
                    "accel::LambdaLR: expected " + std::to_string(opt.param_groups().size()) +
                        " functions (one per group), got " + std::to_string(fns_.size()));
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    std::vector<double> out;
    for (std::size_t i = 0; i < base_lrs_.size(); ++i) out.push_back(base_lrs_[i] * fns_[i](last_epoch_));
    return out;
  }

 private:
  std::vector<Fn> fns_;
};

// [torch:optim/lr_scheduler.py SequentialLR]
//! The schedulers run one after the other, switching at `milestones` (one fewer than schedulers). At its
//! milestone a scheduler restarts from epoch 0 through its closed form where PyTorch has one (StepLR, MultiStepLR,
//! ExponentialLR, LinearLR, CosineAnnealingLR) and its `get_lr()` otherwise; then it steps as usual. Build every
//! scheduler on `opt` first, as in PyTorch: each built scheduler has stepped once, which this constructor undoes.
class SequentialLR : public ExactScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& opt, std::vector<std::shared_ptr<ExactScheduler>> schedulers,
               std::vector<std::int64_t> milestones)
      : ExactScheduler(opt, Bare{}), subs_(std::move(schedulers)), milestones_(std::move(milestones)) {
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
  [[nodiscard]] const std::vector<std::shared_ptr<ExactScheduler>>& schedulers() const noexcept { return subs_; }

 protected:
  //! Its own epoch, milestones and last rates, and each scheduler's state (PyTorch's `_schedulers`).
  void fields(detail::StateIO& io) override {
    io("last_epoch", last_epoch_, detail::Bounds<std::int64_t>{0});
    io.per_group("last_lr", last_lr_, opt_.param_groups().size());
    io.exactly("milestones", milestones_, subs_.size() - 1);
    for (std::size_t i = 0; i < subs_.size(); ++i) io.nested("scheduler_" + std::to_string(i), *subs_[i]);
  }
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

// [transformers:optimization.py get_constant_schedule_with_warmup]
//! Linear warmup from 0 over `warmup` steps, then the initial rate.
inline std::shared_ptr<LambdaLR> constant_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                               std::int64_t last_epoch = -1) {
  return std::make_shared<LambdaLR>(
      opt,
      [warmup](std::int64_t step) {
        if (step < warmup) return double(step) / std::max(1.0, double(warmup));
        return 1.0;
      },
      last_epoch);
}

// [transformers:optimization.py get_linear_schedule_with_warmup]
//! Linear warmup from 0 over `warmup` steps, then a linear decay to 0 at `total`.
inline std::shared_ptr<LambdaLR> linear_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                             std::int64_t total, std::int64_t last_epoch = -1) {
  return std::make_shared<LambdaLR>(
      opt,
      [warmup, total](std::int64_t step) {
        if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
        return std::max(0.0, double(total - step) / double(std::max<std::int64_t>(1, total - warmup)));
      },
      last_epoch);
}

// [transformers:optimization.py get_cosine_schedule_with_warmup]
//! Linear warmup from 0 over `warmup` steps, then `num_cycles` cosine waves down to 0 at `total` (0.5: one
//! half-wave from the initial rate to 0).
inline std::shared_ptr<LambdaLR> cosine_schedule_with_warmup(torch::optim::Optimizer& opt, std::int64_t warmup,
                                                             std::int64_t total, double num_cycles = 0.5,
                                                             std::int64_t last_epoch = -1) {
  return std::make_shared<LambdaLR>(
      opt,
      [warmup, total, num_cycles](std::int64_t step) {
        if (step < warmup) return double(step) / double(std::max<std::int64_t>(1, warmup));
        const double progress = double(step - warmup) / double(std::max<std::int64_t>(1, total - warmup));
        const double min_lr_rate = 0.0;  // transformers' default, kept so that the arithmetic is its own
        double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress));
        factor = factor * (1 - min_lr_rate) + min_lr_rate;
        return std::max(0.0, factor);
      },
      last_epoch);
}

// What Accelerator::prepare asks of a scheduler (TorchScheduler, optim/accelerated.hpp).
static_assert(std::derived_from<ExactScheduler, torch::optim::LRScheduler>);
static_assert(std::derived_from<ReduceLROnPlateau, torch::optim::LRScheduler>);

}  // namespace accel
