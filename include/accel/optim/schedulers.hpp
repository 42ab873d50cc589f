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
//! | `OneCycleLR(opt, max_lr, {...})`    | `lr_scheduler.OneCycleLR`: cos/linear, `three_phase`, `cycle_momentum` (SGD/RMSprop momentum, Adam/AdamW beta1) |
//! | `LambdaLR(opt, fn)` / `LambdaLR(opt, {fn0, fn1})` | `lr_scheduler.LambdaLR`                         |
//! | `SequentialLR(opt, {s0, s1}, milestones)` | `lr_scheduler.SequentialLR` (a later scheduler restarts at its milestone from its closed form) |
//! | `ReduceLROnPlateau(opt, {...})`, `step(metric)` | `lr_scheduler.ReduceLROnPlateau`                    |
//! | `linear_schedule_with_warmup(opt, warmup, total)` | `transformers.get_linear_schedule_with_warmup`    |
//! | `cosine_schedule_with_warmup(opt, warmup, total, cycles)` | `transformers.get_cosine_schedule_with_warmup` |
//! | `constant_schedule_with_warmup(opt, warmup)` | `transformers.get_constant_schedule_with_warmup`       |
//!
//! Each derives from `torch::optim::LRScheduler` (so `Accelerator::prepare` takes a `std::shared_ptr` of it as it
//! takes LibTorch's), and `save`/`load` its whole state as PyTorch's `state_dict` does; `save_state` uses them. The
//! rates themselves live in the optimizer's parameter groups, which the checkpoint saves with the optimizer.
//!
//! ```cpp
//! auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(3e-4));
//! auto [model, opt, sched] = acc.prepare(net, adamw, accel::linear_schedule_with_warmup(*adamw, 100, 2000));
//! ```

#include <accel/error.hpp>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel {

namespace detail {

// Note [initial_lr]: PyTorch keeps each group's starting rate in the group itself (`group["initial_lr"]`, set by
// the first scheduler built on the optimizer with `setdefault`, overwritten by OneCycleLR); every later scheduler
// takes its `base_lrs` from it, which is what makes a cosine built after a warmup (SequentialLR) start from the
// un-warmed rate. LibTorch's groups have no free keys, so the value lives here, one vector per optimizer, shared by
// the schedulers of that optimizer while any of them lives (a scheduler never outlives its optimizer, so the
// address cannot be reused under a live entry). One difference follows: PyTorch's group keeps `initial_lr` after
// its schedulers are gone, here a scheduler built once all earlier ones are destroyed starts from the current rates.
class InitialLrs {
 public:
  //! The optimizer's initial rates: taken from its groups' current rates for groups that have none yet
  //! (`setdefault`), or all replaced by `overwrite`.
  static std::shared_ptr<std::vector<double>> of(torch::optim::Optimizer& opt,
                                                 const std::vector<double>* overwrite = nullptr) {
    auto& self = instance();
    std::lock_guard lock(self.mutex_);
    std::erase_if(self.map_, [](const auto& kv) { return kv.second.expired(); });
    auto& slot = self.map_[&opt];
    auto v = slot.lock();
    if (!v) slot = v = std::make_shared<std::vector<double>>();
    const auto& groups = opt.param_groups();
    if (overwrite) *v = *overwrite;
    for (std::size_t i = v->size(); i < groups.size(); ++i) v->push_back(groups[i].options().get_lr());
    return v;
  }
  //! The initial rates of an optimizer that a live scheduler registered, or none.
  static std::shared_ptr<std::vector<double>> find(const torch::optim::Optimizer& opt) {
    auto& self = instance();
    std::lock_guard lock(self.mutex_);
    auto it = self.map_.find(&opt);
    return it == self.map_.end() ? nullptr : it->second.lock();
  }

 private:
  static InitialLrs& instance() {
    static InitialLrs r;
    return r;
  }
  std::mutex mutex_;
  std::map<const torch::optim::Optimizer*, std::weak_ptr<std::vector<double>>> map_;
};

inline std::vector<double> group_lrs(const torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (const auto& g : opt.param_groups()) out.push_back(g.options().get_lr());
  return out;
}
inline void set_group_lrs(torch::optim::Optimizer& opt, const std::vector<double>& lrs) {
  auto& groups = opt.param_groups();
  detail::require(lrs.size() == groups.size(), "accel: a scheduler computed " + std::to_string(lrs.size()) +
                                           " learning rates for an optimizer of " + std::to_string(groups.size()) +
                                           " parameter groups (was a group added after the scheduler was built?)");
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

//! One value per parameter group: a single value is repeated (PyTorch's `_format_param`).
inline std::vector<double> per_group(const std::vector<double>& v, std::size_t groups, const char* name) {
  if (v.size() == 1) return std::vector<double>(groups, v[0]);
  detail::require(v.size() == groups, std::string("accel: ") + name +
                                          " must have one value, or one per parameter group (" +
                                          std::to_string(groups) + "); it has " + std::to_string(v.size()));
  return v;
}

//! The momentum OneCycleLR cycles: SGD's and RMSprop's `momentum`, Adam's and AdamW's first beta (PyTorch
//! cycles `momentum` or `betas[0]`, whichever the optimizer's defaults have).
enum class MomentumKind { momentum, beta1, none };
inline MomentumKind momentum_kind(const torch::optim::OptimizerOptions& o) {
  if (dynamic_cast<const torch::optim::SGDOptions*>(&o) || dynamic_cast<const torch::optim::RMSpropOptions*>(&o))
    return MomentumKind::momentum;
  if (dynamic_cast<const torch::optim::AdamOptions*>(&o) || dynamic_cast<const torch::optim::AdamWOptions*>(&o))
    return MomentumKind::beta1;
  return MomentumKind::none;
}
inline double momentum_of(torch::optim::OptimizerOptions& o) {
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) return s->momentum();
  if (auto* r = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return r->momentum();
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return std::get<0>(a->betas());
  if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return std::get<0>(w->betas());
  throw InvalidArgument("accel: this optimizer has no momentum or beta1");
}
inline void set_momentum(torch::optim::OptimizerOptions& o, double m) {
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) s->momentum(m);
  else if (auto* r = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) r->momentum(m);
  else if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) std::get<0>(a->betas()) = m;
  else if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&o)) std::get<0>(w->betas()) = m;
  else throw InvalidArgument("accel: this optimizer has no momentum or beta1");
}

inline void put(torch::serialize::OutputArchive& a, const std::string& k, c10::IValue v) { a.write(k, v); }
inline c10::IValue get(torch::serialize::InputArchive& a, const std::string& k) {
  c10::IValue v;
  a.read(k, v);
  return v;
}
}  // namespace detail

// [torch:optim/lr_scheduler.py LRScheduler]
//! PyTorch's `LRScheduler`: the base of every scheduler here but ReduceLROnPlateau. Derived classes supply
//! `get_lr()` (the chainable form, read at the already advanced `last_epoch`) and, where PyTorch has one,
//! `closed_form_lr()`; their constructors end with `initial_step()`, as PyTorch's `__init__` does.
class ExactScheduler : public torch::optim::LRScheduler {
 public:
  //! The rates of the last step (PyTorch's `get_last_lr()`).
  [[nodiscard]] const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  //! Steps taken since construction (0 right after it; PyTorch's `last_epoch`).
  [[nodiscard]] std::int64_t last_epoch() const noexcept { return last_epoch_; }
  //! PyTorch's `_step_count`: 1 after construction, +1 per step.
  [[nodiscard]] std::int64_t step_count() const noexcept { return step_count_py_; }
  //! The groups' initial rates (PyTorch's `base_lrs`).
  [[nodiscard]] const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  [[nodiscard]] torch::optim::Optimizer& optimizer() const noexcept { return opt_; }

  //! Everything PyTorch's `state_dict()` holds for this scheduler (the hyperparameters too: PyTorch's
  //! `load_state_dict` restores them, so a loaded scheduler goes on with the saved ones).
  virtual void save(torch::serialize::OutputArchive& a) const {
    detail::put(a, "last_epoch", last_epoch_);
    detail::put(a, "step_count", step_count_py_);
    detail::put(a, "base_lrs", base_lrs_);
    detail::put(a, "last_lr", last_lr_);
    save_extra(a);
  }
  virtual void load(torch::serialize::InputArchive& a) {
    last_epoch_ = detail::get(a, "last_epoch").toInt();
    step_count_py_ = detail::get(a, "step_count").toInt();
    base_lrs_ = detail::get(a, "base_lrs").toDoubleVector();
    last_lr_ = detail::get(a, "last_lr").toDoubleVector();
    load_extra(a);
  }

 protected:
  //! `last_epoch` -1 starts a schedule (the groups' current rates become their initial rates unless a scheduler
  //! set them first); k >= 0 resumes one at k+1, from the initial rates an earlier scheduler of this optimizer set.
  //! `overwrite`: the initial rates to set instead (OneCycleLR's).
  ExactScheduler(torch::optim::Optimizer& opt, std::int64_t last_epoch,
                 std::optional<std::vector<double>> overwrite = std::nullopt)
      : torch::optim::LRScheduler(opt), opt_(opt) {
    if (last_epoch == -1) {
      initial_ = detail::InitialLrs::of(opt, overwrite ? &*overwrite : nullptr);
    } else {
      initial_ = detail::InitialLrs::find(opt);
      detail::require(initial_ && initial_->size() == opt.param_groups().size(),
              "accel: a scheduler resumed with last_epoch >= 0 needs the groups' initial rates, which a scheduler "
              "built on this optimizer with last_epoch = -1 sets (PyTorch's 'initial_lr' KeyError); to resume, "
              "build with -1 and load() the saved state");
    }
    base_lrs_ = *initial_;
    last_epoch_ = last_epoch;
  }
  //! SequentialLR's: no base rates, no initial step of its own.
  struct Bare {};
  ExactScheduler(torch::optim::Optimizer& opt, Bare) : torch::optim::LRScheduler(opt), opt_(opt) {}

  //! PyTorch's `get_lr()`: the rates at `last_epoch`, usually from the groups' current rates.
  virtual std::vector<double> get_lr() = 0;
  //! PyTorch's `_get_closed_form_lr()`, for the schedulers that have one (used when SequentialLR restarts one).
  [[nodiscard]] virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  virtual void save_extra(torch::serialize::OutputArchive&) const {}
  virtual void load_extra(torch::serialize::InputArchive&) {}

  // [torch:optim/lr_scheduler.py LRScheduler._initial_step]
  void initial_step() {
    step_count_py_ = 0;
    is_initial_ = true;
    struct Reset {
      bool& b;
      ~Reset() { b = false; }
    } reset{is_initial_};
    step();
  }
  // [torch:optim/lr_scheduler.py LRScheduler.step]
  virtual void advance() {
    ++step_count_py_;
    update_lr(std::nullopt);
  }
  // [torch:optim/lr_scheduler.py LRScheduler._update_lr]
  void update_lr(std::optional<std::int64_t> epoch) {
    std::vector<double> values;
    if (!epoch) {
      ++last_epoch_;
      values = get_lr();
    } else {
      last_epoch_ = *epoch;
      auto closed = closed_form_lr();
      values = closed ? std::move(*closed) : get_lr();
    }
    detail::set_group_lrs(opt_, values);
    last_lr_ = detail::group_lrs(opt_);
  }
  //! SequentialLR's `recursive_undo`: the initial step of construction taken back.
  virtual void undo_initial_step() { --last_epoch_; }
  [[nodiscard]] std::vector<double> current_lrs() const { return detail::group_lrs(opt_); }

  torch::optim::Optimizer& opt_;
  std::shared_ptr<std::vector<double>> initial_;
  std::vector<double> base_lrs_, last_lr_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_py_ = 0;
  bool is_initial_ = false;

 private:
  friend class SequentialLR;
  // LibTorch's `step()` calls this and then writes the rates returned into the groups: PyTorch's step has
  // already done so (the same values), so LibTorch's write changes nothing and `step()` works through a
  // `torch::optim::LRScheduler&` too.
  std::vector<double> get_lrs() final {
    advance();
    return current_lrs();
  }
};

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
    auto lrs = current_lrs();
    if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
    for (auto& lr : lrs) lr *= gamma_;
    return lrs;
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    std::vector<double> out;
    for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, double(last_epoch_ / step_size_)));
    return out;
  }
  void save_extra(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "step_size", step_size_);
    detail::put(a, "gamma", gamma_);
  }
  void load_extra(torch::serialize::InputArchive& a) override {
    step_size_ = detail::get(a, "step_size").toInt();
    gamma_ = detail::get(a, "gamma").toDouble();
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
    auto lrs = current_lrs();
    const auto n = std::ranges::count(milestones_, last_epoch_);
    if (n == 0) return lrs;
    for (auto& lr : lrs) lr *= std::pow(gamma_, double(n));
    return lrs;
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    const auto passed = std::ranges::upper_bound(milestones_, last_epoch_) - milestones_.begin();  // bisect_right
    std::vector<double> out;
    for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, double(passed)));
    return out;
  }
  void save_extra(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "milestones", milestones_);
    detail::put(a, "gamma", gamma_);
  }
  void load_extra(torch::serialize::InputArchive& a) override {
    milestones_ = detail::get(a, "milestones").toIntVector();
    gamma_ = detail::get(a, "gamma").toDouble();
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
    auto lrs = current_lrs();
    if (is_initial_) return lrs;
    for (auto& lr : lrs) lr *= gamma_;
    return lrs;
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    std::vector<double> out;
    for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, double(last_epoch_)));
    return out;
  }
  void save_extra(torch::serialize::OutputArchive& a) const override { detail::put(a, "gamma", gamma_); }
  void load_extra(torch::serialize::InputArchive& a) override { gamma_ = detail::get(a, "gamma").toDouble(); }

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
    auto lrs = current_lrs();
    if (last_epoch_ == 0) {
      for (auto& lr : lrs) lr *= start_;
      return lrs;
    }
    if (is_initial_ || last_epoch_ > total_) return lrs;
    // The same parenthesisation as PyTorch's: the factor first, then the product.
    const double f =
        1.0 + (end_ - start_) / (double(total_) * start_ + double(last_epoch_ - 1) * (end_ - start_));
    for (auto& lr : lrs) lr *= f;
    return lrs;
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    std::vector<double> out;
    for (double b : base_lrs_)
      out.push_back(b * (start_ + (end_ - start_) * double(std::min(total_, last_epoch_)) / double(total_)));
    return out;
  }
  void save_extra(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "start_factor", start_);
    detail::put(a, "end_factor", end_);
    detail::put(a, "total_iters", total_);
  }
  void load_extra(torch::serialize::InputArchive& a) override {
    start_ = detail::get(a, "start_factor").toDouble();
    end_ = detail::get(a, "end_factor").toDouble();
    total_ = detail::get(a, "total_iters").toInt();
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
  void save_extra(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "T_max", t_max_);
    detail::put(a, "eta_min", eta_min_);
  }
  void load_extra(torch::serialize::InputArchive& a) override {
    t_max_ = detail::get(a, "T_max").toInt();
    eta_min_ = detail::get(a, "eta_min").toDouble();
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

// [torch:optim/lr_scheduler.py OneCycleLR]
enum class Anneal { cos, linear };
struct OneCycleOptions {
  std::int64_t total_steps = 0;  //!< or epochs * steps_per_epoch when 0
  std::int64_t epochs = 0;
  std::int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  Anneal anneal_strategy = Anneal::cos;
  bool cycle_momentum = true;
  std::vector<double> base_momentum{0.85};  //!< one value, or one per group
  std::vector<double> max_momentum{0.95};   //!< one value, or one per group
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

//! `max_lr`: one value, or one per group. The groups' initial rates become `max_lr / div_factor` (PyTorch
//! overwrites `initial_lr`), whatever they were.
class OneCycleLR : public ExactScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& opt, const std::vector<double>& max_lr, OneCycleOptions o = {})
      : ExactScheduler(opt, -1, initial_of(opt, max_lr, o)), o_(std::move(o)) {
    total_steps_ = o_.total_steps > 0 ? o_.total_steps : o_.epochs * o_.steps_per_epoch;
    detail::require(o_.total_steps > 0 || (o_.epochs > 0 && o_.steps_per_epoch > 0),
            "accel::OneCycleLR: set total_steps, or epochs and steps_per_epoch (all positive)");
    detail::require(o_.pct_start >= 0 && o_.pct_start <= 1, "accel::OneCycleLR: pct_start must be in [0, 1]");
    const auto n = opt.param_groups().size();
    max_lrs_ = detail::per_group(max_lr, n, "max_lr");
    for (std::size_t i = 0; i < n; ++i) min_lrs_.push_back(base_lrs_[i] / o_.final_div_factor);
    const double t = double(total_steps_);
    if (o_.three_phase)
      phases_ = {{o_.pct_start * t - 1, Ref::initial, Ref::max, Ref::max_m, Ref::base_m},
                 {2 * o_.pct_start * t - 2, Ref::max, Ref::initial, Ref::base_m, Ref::max_m},
                 {t - 1, Ref::initial, Ref::min, Ref::max_m, Ref::max_m}};
    else
      phases_ = {{o_.pct_start * t - 1, Ref::initial, Ref::max, Ref::max_m, Ref::base_m},
                 {t - 1, Ref::max, Ref::min, Ref::base_m, Ref::max_m}};
    if (o_.cycle_momentum) {
      detail::require(detail::momentum_kind(opt.defaults()) != detail::MomentumKind::none,
              "accel::OneCycleLR: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, Adam, "
              "AdamW); pass cycle_momentum = false");
      max_m_ = detail::per_group(o_.max_momentum, n, "max_momentum");
      base_m_ = detail::per_group(o_.base_momentum, n, "base_momentum");
      for (std::size_t i = 0; i < n; ++i) detail::set_momentum(opt.param_groups()[i].options(), max_m_[i]);
    }
    initial_step();
  }
  [[nodiscard]] std::int64_t total_steps() const noexcept { return total_steps_; }

 protected:
  std::vector<double> get_lr() override {
    const auto step = last_epoch_;
    detail::require(step <= total_steps_, "accel::OneCycleLR: tried to step " + std::to_string(step) +
                                      " times; the specified number of total steps is " + std::to_string(total_steps_));
    auto& groups = opt_.param_groups();
    std::vector<double> lrs;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      double start = 0.0, lr = 0.0, m = 0.0;
      for (std::size_t i = 0; i < phases_.size(); ++i) {
        const auto& p = phases_[i];
        if (double(step) <= p.end_step || i + 1 == phases_.size()) {
          const double pct = (double(step) - start) / (p.end_step - start);
          lr = anneal(value(p.start_lr, g), value(p.end_lr, g), pct);
          if (o_.cycle_momentum) m = anneal(value(p.start_m, g), value(p.end_m, g), pct);
          break;
        }
        start = p.end_step;
      }
      lrs.push_back(lr);
      if (o_.cycle_momentum) detail::set_momentum(groups[g].options(), m);
    }
    return lrs;
  }
  void save_extra(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "total_steps", total_steps_);
    detail::put(a, "anneal_cos", o_.anneal_strategy == Anneal::cos);
    detail::put(a, "cycle_momentum", o_.cycle_momentum);
    std::vector<double> ends;
    std::vector<std::int64_t> refs;
    for (const auto& p : phases_) {
      ends.push_back(p.end_step);
      for (Ref r : {p.start_lr, p.end_lr, p.start_m, p.end_m}) refs.push_back(std::int64_t(r));
    }
    detail::put(a, "phase_end_steps", ends);
    detail::put(a, "phase_refs", refs);
    // What PyTorch keeps in the optimizer's groups (initial_lr is base_lrs).
    detail::put(a, "max_lr", max_lrs_);
    detail::put(a, "min_lr", min_lrs_);
    detail::put(a, "max_momentum", max_m_);
    detail::put(a, "base_momentum", base_m_);
  }
  void load_extra(torch::serialize::InputArchive& a) override {
    total_steps_ = detail::get(a, "total_steps").toInt();
    o_.anneal_strategy = detail::get(a, "anneal_cos").toBool() ? Anneal::cos : Anneal::linear;
    o_.cycle_momentum = detail::get(a, "cycle_momentum").toBool();
    const auto ends = detail::get(a, "phase_end_steps").toDoubleVector();
    const auto refs = detail::get(a, "phase_refs").toIntVector();
    detail::require(refs.size() == 4 * ends.size(), "accel::OneCycleLR: a saved state with malformed phases");
    phases_.clear();
    for (std::size_t i = 0; i < ends.size(); ++i)
      phases_.push_back({ends[i], Ref(refs[4 * i]), Ref(refs[4 * i + 1]), Ref(refs[4 * i + 2]), Ref(refs[4 * i + 3])});
    max_lrs_ = detail::get(a, "max_lr").toDoubleVector();
    min_lrs_ = detail::get(a, "min_lr").toDoubleVector();
    max_m_ = detail::get(a, "max_momentum").toDoubleVector();
    base_m_ = detail::get(a, "base_momentum").toDoubleVector();
  }

 private:
  enum class Ref : std::int64_t { initial, max, min, max_m, base_m };
  struct Phase {
    double end_step;
    Ref start_lr, end_lr, start_m, end_m;
  };
  static std::vector<double> initial_of(torch::optim::Optimizer& opt, const std::vector<double>& max_lr,
                                        const OneCycleOptions& o) {
    auto v = detail::per_group(max_lr, opt.param_groups().size(), "max_lr");
    for (auto& x : v) x /= o.div_factor;
    return v;
  }
  [[nodiscard]] double value(Ref r, std::size_t g) const {
    switch (r) {
      case Ref::initial: return base_lrs_[g];
      case Ref::max: return max_lrs_[g];
      case Ref::min: return min_lrs_[g];
      case Ref::max_m: return max_m_[g];
      case Ref::base_m: return base_m_[g];
    }
    return 0.0;
  }
  [[nodiscard]] double anneal(double start, double end, double pct) const {
    if (o_.anneal_strategy == Anneal::cos) {
      const double cos_out = std::cos(std::numbers::pi * pct) + 1;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  OneCycleOptions o_;
  std::int64_t total_steps_ = 0;
  std::vector<Phase> phases_;
  std::vector<double> max_lrs_, min_lrs_, max_m_, base_m_;
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
            "accel::SequentialLR expects one milestone fewer than schedulers, got " + std::to_string(subs_.size()) +
                " schedulers and " + std::to_string(milestones_.size()) + " milestones");
    initial_ = detail::InitialLrs::find(opt);
    detail::require(initial_ != nullptr, "accel::SequentialLR: the optimizer's initial rates are unknown");
    last_epoch_ = 0;
    detail::set_group_lrs(opt, *initial_);
    for (auto& s : subs_) s->undo_initial_step();
    subs_[index(0)]->initial_step();
    last_lr_ = subs_[index(0)]->get_last_lr();
  }
  [[nodiscard]] const std::vector<std::shared_ptr<ExactScheduler>>& schedulers() const noexcept { return subs_; }

  //! Its own epoch, milestones and last rates, and each scheduler's state (PyTorch's `_schedulers`).
  void save(torch::serialize::OutputArchive& a) const override {
    detail::put(a, "last_epoch", last_epoch_);
    detail::put(a, "last_lr", last_lr_);
    detail::put(a, "milestones", milestones_);
    for (std::size_t i = 0; i < subs_.size(); ++i) {
      torch::serialize::OutputArchive sub(a.compilation_unit());
      subs_[i]->save(sub);
      a.write("scheduler_" + std::to_string(i), sub);
    }
  }
  void load(torch::serialize::InputArchive& a) override {
    last_epoch_ = detail::get(a, "last_epoch").toInt();
    last_lr_ = detail::get(a, "last_lr").toDoubleVector();
    milestones_ = detail::get(a, "milestones").toIntVector();
    for (std::size_t i = 0; i < subs_.size(); ++i) {
      torch::serialize::InputArchive sub;
      a.read("scheduler_" + std::to_string(i), sub);
      subs_[i]->load(sub);
    }
  }

 protected:
  void advance() override {
    ++last_epoch_;
    const auto i = index(last_epoch_);
    auto& s = *subs_[i];
    if (i > 0 && milestones_[i - 1] == last_epoch_) s.update_lr(0);
    else s.step();
    last_lr_ = s.get_last_lr();
  }
  std::vector<double> get_lr() override {
    throw InvalidArgument("accel::SequentialLR has no get_lr() (PyTorch's raises NotImplementedError): a "
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

// [torch:optim/lr_scheduler.py ReduceLROnPlateau]
enum class PlateauMode { min, max };
enum class ThresholdMode { rel, abs };
struct PlateauOptions {
  PlateauMode mode = PlateauMode::min;
  double factor = 0.1;
  std::int64_t patience = 10;
  double threshold = 1e-4;
  ThresholdMode threshold_mode = ThresholdMode::rel;
  std::int64_t cooldown = 0;
  std::vector<double> min_lr{0.0};  //!< one value for every group, or one per group
  double eps = 1e-8;
};

//! Lowers the rates by `factor` once the metric passed to `step(metric)` has not improved for more than
//! `patience` steps. Derived from `torch::optim::LRScheduler` so that `prepare` takes it; its `step()` without a
//! metric is deleted (and throws when called through the base class).
class ReduceLROnPlateau : public torch::optim::LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& opt, PlateauOptions o = {})
      : torch::optim::LRScheduler(opt), opt_(opt), o_(std::move(o)) {
    detail::require(o_.factor < 1.0, "accel::ReduceLROnPlateau: factor should be < 1.0");
    const auto n = opt.param_groups().size();
    if (o_.min_lr.size() == 1) default_min_lr_ = o_.min_lr[0];  // PyTorch's min_lr given as a number
    min_lrs_ = detail::per_group(o_.min_lr, n, "min_lr");
    last_lr_ = detail::group_lrs(opt);
    reset();
  }

  void step() = delete;  // a plateau is judged on a metric: step(metric)
  // [torch:optim/lr_scheduler.py ReduceLROnPlateau.step]
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
    last_lr_ = detail::group_lrs(opt_);
  }

  [[nodiscard]] const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  [[nodiscard]] std::int64_t last_epoch() const noexcept { return last_epoch_; }
  [[nodiscard]] double best() const noexcept { return best_; }
  [[nodiscard]] std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  [[nodiscard]] std::int64_t cooldown_counter() const noexcept { return cooldown_counter_; }
  [[nodiscard]] bool in_cooldown() const noexcept { return cooldown_counter_ > 0; }

  void save(torch::serialize::OutputArchive& a) const {
    detail::put(a, "mode_max", o_.mode == PlateauMode::max);
    detail::put(a, "factor", o_.factor);
    detail::put(a, "patience", o_.patience);
    detail::put(a, "threshold", o_.threshold);
    detail::put(a, "threshold_abs", o_.threshold_mode == ThresholdMode::abs);
    detail::put(a, "cooldown", o_.cooldown);
    detail::put(a, "min_lrs", min_lrs_);
    detail::put(a, "eps", o_.eps);
    detail::put(a, "last_epoch", last_epoch_);
    detail::put(a, "last_lr", last_lr_);
    detail::put(a, "best", best_);
    detail::put(a, "num_bad_epochs", num_bad_epochs_);
    detail::put(a, "cooldown_counter", cooldown_counter_);
  }
  void load(torch::serialize::InputArchive& a) {
    o_.mode = detail::get(a, "mode_max").toBool() ? PlateauMode::max : PlateauMode::min;
    o_.factor = detail::get(a, "factor").toDouble();
    o_.patience = detail::get(a, "patience").toInt();
    o_.threshold = detail::get(a, "threshold").toDouble();
    o_.threshold_mode = detail::get(a, "threshold_abs").toBool() ? ThresholdMode::abs : ThresholdMode::rel;
    o_.cooldown = detail::get(a, "cooldown").toInt();
    min_lrs_ = detail::get(a, "min_lrs").toDoubleVector();
    o_.eps = detail::get(a, "eps").toDouble();
    last_epoch_ = detail::get(a, "last_epoch").toInt();
    last_lr_ = detail::get(a, "last_lr").toDoubleVector();
    best_ = detail::get(a, "best").toDouble();
    num_bad_epochs_ = detail::get(a, "num_bad_epochs").toInt();
    cooldown_counter_ = detail::get(a, "cooldown_counter").toInt();
  }

 private:
  std::vector<double> get_lrs() override {
    throw InvalidArgument("accel::ReduceLROnPlateau steps with a metric: call step(metric)");
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
  PlateauOptions o_;
  std::optional<double> default_min_lr_;
  std::vector<double> min_lrs_, last_lr_;
  std::int64_t last_epoch_ = 0;
  double best_ = 0.0;
  std::int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0;
};

// ---- transformers' warmup schedules (transformers/optimization.py), as LambdaLRs ---------------------------

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
