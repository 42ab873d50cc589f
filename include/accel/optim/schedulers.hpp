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
#include <type_traits>
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

inline void set_group_lrs(torch::optim::Optimizer& opt, const std::vector<double>& lrs) {
  auto& groups = opt.param_groups();
  if (lrs.size() != groups.size())
    throw InvalidArgument("accel: a scheduler computed " + std::to_string(lrs.size()) +
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

//! Every rate times one factor (`rate * factor`, element by element).
inline std::vector<double> scaled(std::vector<double> rates, double factor) {
  for (auto& r : rates) r *= factor;
  return rates;
}

//! The momentum OneCycleLR cycles: SGD's and RMSprop's `momentum`, Adam's and AdamW's first beta (PyTorch
//! cycles `momentum` or `betas[0]`, whichever the optimizer's defaults have); nullptr for other optimizers.
inline double* momentum_slot(torch::optim::OptimizerOptions& o) {
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) return &s->momentum();
  if (auto* r = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return &r->momentum();
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return &std::get<0>(a->betas());
  if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return &std::get<0>(w->betas());
  return nullptr;
}

//! A scheduler's state fields, listed once (`fields(StateIO&)`) for both directions: each call writes the field
//! into the archive when saving, or reads it back when loading.
class StateIO {
 public:
  explicit StateIO(torch::serialize::OutputArchive& a) : out_(&a) {}
  explicit StateIO(torch::serialize::InputArchive& a) : in_(&a) {}
  [[nodiscard]] bool reading() const noexcept { return in_ != nullptr; }

  void operator()(const std::string& key, std::int64_t& v) { io(key, v, &c10::IValue::toInt); }
  void operator()(const std::string& key, double& v) { io(key, v, &c10::IValue::toDouble); }
  void operator()(const std::string& key, bool& v) { io(key, v, &c10::IValue::toBool); }
  void operator()(const std::string& key, std::vector<double>& v) { io(key, v, &c10::IValue::toDoubleVector); }
  void operator()(const std::string& key, std::vector<std::int64_t>& v) { io(key, v, &c10::IValue::toIntVector); }
  //! A two-valued enum, kept as the bool `v == when_true`.
  template <class E>
    requires std::is_enum_v<E>
  void operator()(const std::string& key, E& v, E when_true, E when_false) {
    bool b = v == when_true;
    (*this)(key, b);
    if (reading()) v = b ? when_true : when_false;
  }
  //! An object with its own `save`/`load`, in an archive of its own under `key`.
  template <class T>
  void nested(const std::string& key, T& v) {
    if (out_) {
      torch::serialize::OutputArchive sub(out_->compilation_unit());
      v.save(sub);
      out_->write(key, sub);
    } else {
      torch::serialize::InputArchive sub;
      in_->read(key, sub);
      v.load(sub);
    }
  }

 private:
  template <class T, class Read>
  void io(const std::string& key, T& v, Read read) {
    if (out_) {
      out_->write(key, c10::IValue(v));
    } else {
      c10::IValue x;
      in_->read(key, x);
      v = (x.*read)();
    }
  }
  torch::serialize::OutputArchive* out_ = nullptr;
  torch::serialize::InputArchive* in_ = nullptr;
};
}  // namespace detail

// [torch:optim/lr_scheduler.py LRScheduler]
//! PyTorch's `LRScheduler`: the base of every scheduler here but ReduceLROnPlateau. Derived classes supply
//! `get_lr()` (the chainable form, read at the already advanced `last_epoch`) and, where PyTorch has one,
//! `closed_form_lr()`, and add their state to `fields()`; their constructors end with `initial_step()`, as
//! PyTorch's `__init__` does.
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
  void save(torch::serialize::OutputArchive& a) const {
    detail::StateIO io(a);
    const_cast<ExactScheduler*>(this)->fields(io);  // saving only reads the fields
  }
  void load(torch::serialize::InputArchive& a) {
    detail::StateIO io(a);
    fields(io);
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
  //! The state `save` writes and `load` reads, each field listed once; derived classes add theirs.
  virtual void fields(detail::StateIO& io) {
    io("last_epoch", last_epoch_);
    io("step_count", step_count_py_);
    io("base_lrs", base_lrs_);
    io("last_lr", last_lr_);
  }

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
    last_lr_ = std::move(values);  // what the groups now hold: set_lr keeps the double as given
  }
  //! SequentialLR's `recursive_undo`: the initial step of construction taken back.
  virtual void undo_initial_step() { --last_epoch_; }

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
    return last_lr_;
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
    if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return get_current_lrs();
    return detail::scaled(get_current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return detail::scaled(base_lrs_, std::pow(gamma_, double(last_epoch_ / step_size_)));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("step_size", step_size_);
    io("gamma", gamma_);
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
    io("gamma", gamma_);
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
    io("gamma", gamma_);
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
    const double f =
        1.0 + (end_ - start_) / (double(total_) * start_ + double(last_epoch_ - 1) * (end_ - start_));
    return detail::scaled(get_current_lrs(), f);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return detail::scaled(base_lrs_,
                          start_ + (end_ - start_) * double(std::min(total_, last_epoch_)) / double(total_));
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("start_factor", start_);
    io("end_factor", end_);
    io("total_iters", total_);
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
    io("T_max", t_max_);
    io("eta_min", eta_min_);
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
    detail::require(o_.total_steps > 0 || (o_.epochs > 0 && o_.steps_per_epoch > 0),
            "accel::OneCycleLR: set total_steps, or epochs and steps_per_epoch (all positive)");
    if (o_.total_steps <= 0) o_.total_steps = o_.epochs * o_.steps_per_epoch;
    detail::require(o_.pct_start >= 0 && o_.pct_start <= 1, "accel::OneCycleLR: pct_start must be in [0, 1]");
    const auto n = opt.param_groups().size();
    max_lrs_ = detail::per_group(max_lr, n, "max_lr");
    for (std::size_t i = 0; i < n; ++i) min_lrs_.push_back(base_lrs_[i] / o_.final_div_factor);
    phases_ = make_phases();
    if (o_.cycle_momentum) {
      detail::require(detail::momentum_slot(opt.defaults()) != nullptr,
              "accel::OneCycleLR: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, Adam, "
              "AdamW); pass cycle_momentum = false");
      max_m_ = detail::per_group(o_.max_momentum, n, "max_momentum");
      base_m_ = detail::per_group(o_.base_momentum, n, "base_momentum");
      for (std::size_t i = 0; i < n; ++i) momentum(opt.param_groups()[i].options()) = max_m_[i];
    }
    initial_step();
  }
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
      if (o_.cycle_momentum)
        momentum(groups[g].options()) = anneal((this->*p->start_m)[g], (this->*p->end_m)[g], pct);
    }
    return lrs;
  }
  void fields(detail::StateIO& io) override {
    ExactScheduler::fields(io);
    io("total_steps", o_.total_steps);
    io("pct_start", o_.pct_start);
    io("three_phase", o_.three_phase);
    io("anneal_cos", o_.anneal_strategy, Anneal::cos, Anneal::linear);
    io("cycle_momentum", o_.cycle_momentum);
    // What PyTorch keeps in the optimizer's groups (initial_lr is base_lrs).
    io("max_lr", max_lrs_);
    io("min_lr", min_lrs_);
    io("max_momentum", max_m_);
    io("base_momentum", base_m_);
    if (io.reading()) phases_ = make_phases();
  }

 private:
  //! One of the per-group vectors a phase starts or ends at.
  using Ref = std::vector<double> OneCycleLR::*;
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

  OneCycleOptions o_;  //!< total_steps: as given, or epochs * steps_per_epoch
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


 protected:
  //! Its own epoch, milestones and last rates, and each scheduler's state (PyTorch's `_schedulers`).
  void fields(detail::StateIO& io) override {
    io("last_epoch", last_epoch_);
    io("last_lr", last_lr_);
    io("milestones", milestones_);
    for (std::size_t i = 0; i < subs_.size(); ++i) io.nested("scheduler_" + std::to_string(i), *subs_[i]);
  }
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
    last_lr_ = get_current_lrs();
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
    last_lr_ = get_current_lrs();
  }

  [[nodiscard]] const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  [[nodiscard]] std::int64_t last_epoch() const noexcept { return last_epoch_; }
  [[nodiscard]] double best() const noexcept { return best_; }
  [[nodiscard]] std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  [[nodiscard]] std::int64_t cooldown_counter() const noexcept { return cooldown_counter_; }
  [[nodiscard]] bool in_cooldown() const noexcept { return cooldown_counter_ > 0; }

  void save(torch::serialize::OutputArchive& a) const {
    detail::StateIO io(a);
    const_cast<ReduceLROnPlateau*>(this)->fields(io);  // saving only reads the fields
  }
  void load(torch::serialize::InputArchive& a) {
    detail::StateIO io(a);
    fields(io);
  }

 private:
  std::vector<double> get_lrs() override {
    throw InvalidArgument("accel::ReduceLROnPlateau steps with a metric: call step(metric)");
  }
  void fields(detail::StateIO& io) {
    io("mode_max", o_.mode, PlateauMode::max, PlateauMode::min);
    io("factor", o_.factor);
    io("patience", o_.patience);
    io("threshold", o_.threshold);
    io("threshold_abs", o_.threshold_mode, ThresholdMode::abs, ThresholdMode::rel);
    io("cooldown", o_.cooldown);
    io("min_lrs", min_lrs_);
    io("eps", o_.eps);
    io("last_epoch", last_epoch_);
    io("last_lr", last_lr_);
    io("best", best_);
    io("num_bad_epochs", num_bad_epochs_);
    io("cooldown_counter", cooldown_counter_);
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
