#pragma once
//! \file
//! `ExactScheduler`: the base of accel's PyTorch-exact learning-rate schedulers (optim/schedulers.hpp): PyTorch's
//! `LRScheduler` state (`last_epoch`, `base_lrs`, `_last_lr`, `_step_count`), its initial step, the groups' initial
//! rates shared between schedulers of one optimizer, and `save`/`load` of the whole state (StateIO).

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
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

// ---- what a scheduler of one's own uses (public; see ExactScheduler) ----------------------------------------

//! Every rate times one factor (`rate * factor`, element by element): the chainable step of most schedulers.
inline std::vector<double> scaled(std::vector<double> rates, double factor) {
  for (auto& r : rates) r *= factor;
  return rates;
}

//! The values a loaded field may take: what the scheduler's constructor accepts (a saved state read from elsewhere
//! must not divide by zero, index past a group, or step a counter it cannot hold).
template <class T>
struct Bounds {
  //!@{
  //! The smallest and the largest value accepted.
  T least = std::numeric_limits<T>::lowest(), most = std::numeric_limits<T>::max();
  //!@}
};

//! A scheduler's state fields, listed once (`fields(StateIO&)`) for both directions: each call writes the field
//! into the archive when saving, or reads it back when loading; a value read outside its bounds, or a per-group
//! list of another length, is an `InvalidArgument` naming the field (and the loader names the file).
class StateIO {
 public:
  //! Saving: each call writes its field into `a`.
  explicit StateIO(torch::serialize::OutputArchive& a) : out_(&a) {}
  //! Loading: each call reads its field back from `a`.
  explicit StateIO(torch::serialize::InputArchive& a) : in_(&a) {}
  //! True when loading (a scheduler re-derives what it keeps from a loaded field here, e.g. a sorted list).
  [[nodiscard]] bool reading() const noexcept { return in_ != nullptr; }

  //!@{
  //! One field under `key`: a count, a number, a flag or a list of them, written or read back.
  void operator()(const std::string& key, std::int64_t& v) { io(key, v, &c10::IValue::toInt); }
  void operator()(const std::string& key, double& v) { io(key, v, &c10::IValue::toDouble); }
  void operator()(const std::string& key, bool& v) { io(key, v, &c10::IValue::toBool); }
  void operator()(const std::string& key, std::vector<double>& v) { io(key, v, &c10::IValue::toDoubleVector); }
  void operator()(const std::string& key, std::vector<std::int64_t>& v) { io(key, v, &c10::IValue::toIntVector); }
  //!@}
  //! A number within `b` (NaN is never within).
  template <class T>
  requires std::same_as<T, std::int64_t> || std::same_as<T, double>
  void operator()(const std::string& key, T& v, Bounds<T> b) {
    T x = v;
    (*this)(key, x);
    if (!(x >= b.least && x <= b.most))
      throw InvalidArgument("scheduler state '" + key + "' is " + text(x) + ", outside [" + text(b.least) + ", " +
                            text(b.most) + "]");
    v = x;
  }
  //! One number per parameter group (`groups`), each finite.
  void per_group(const std::string& key, std::vector<double>& v, std::size_t groups) { exactly(key, v, groups); }
  //! A list of `count` values (each finite, for numbers).
  template <class T>
  void exactly(const std::string& key, std::vector<T>& v, std::size_t count) {
    std::vector<T> x = v;
    (*this)(key, x);
    if (x.size() != count)
      throw InvalidArgument("scheduler state '" + key + "' has " + std::to_string(x.size()) +
                            " values, this scheduler " + std::to_string(count) +
                            " (one per parameter group, or per scheduler)");
    for (const auto e : x)
      if (!std::isfinite(double(e))) throw InvalidArgument("scheduler state '" + key + "' holds " + text(e));
    v = std::move(x);
  }
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
  template <class T>
  static std::string text(T v) {
    if constexpr (std::is_floating_point_v<T>) {
      std::ostringstream s;
      s << v;
      return s.str();
    } else {
      return std::to_string(v);
    }
  }
  torch::serialize::OutputArchive* out_ = nullptr;
  torch::serialize::InputArchive* in_ = nullptr;
};

namespace detail {

// The names a scheduler of one's own used before they were public (kept so such code compiles).
using accel::Bounds;
using accel::scaled;
using accel::StateIO;

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

//! The momentum OneCycleLR cycles: SGD's and RMSprop's `momentum`, Adam's and AdamW's first beta (PyTorch
//! cycles `momentum` or `betas[0]`, whichever the optimizer's defaults have); nullptr for other optimizers.
inline double* momentum_slot(torch::optim::OptimizerOptions& o) {
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) return &s->momentum();
  if (auto* r = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return &r->momentum();
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return &std::get<0>(a->betas());
  if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return &std::get<0>(w->betas());
  return nullptr;
}

//! `save`/`load` of a scheduler's whole state through its one list of fields (`Derived::fields(StateIO&)`, which
//! the derived class makes reachable with `friend class detail::SavedFields<Derived>`).
template <class Derived>
class SavedFields {
 public:
  void save(torch::serialize::OutputArchive& a) const {
    StateIO io(a);
    static_cast<Derived&>(const_cast<SavedFields&>(*this)).fields(io);  // saving only reads the fields
  }
  void load(torch::serialize::InputArchive& a) {
    StateIO io(a);
    static_cast<Derived&>(*this).fields(io);
  }
  //! Refuses a state that `load` would refuse, and leaves this one as it was: loads it, then puts back its own.
  void check(torch::serialize::InputArchive& a) {
    std::ostringstream kept;
    {
      torch::serialize::OutputArchive own;
      save(own);
      own.save_to(kept);
    }
    auto put_back = [&] {
      std::istringstream in(kept.str());
      torch::serialize::InputArchive own;
      own.load_from(in);
      load(own);
    };
    try {
      load(a);
    } catch (...) {
      put_back();
      throw;
    }
    put_back();
  }
};
}  // namespace detail

// [torch:optim/lr_scheduler.py LRScheduler]
//! PyTorch's `LRScheduler`: the base of every scheduler here but ReduceLROnPlateau, and of one's own.
//!
//! Writing an exact scheduler needs only these public names (tests/unit/optim/schedulers.cpp, "a scheduler of
//! one's own", is one):
//!   - derive from `ExactScheduler`, call `ExactScheduler(opt, last_epoch)` and end the constructor with
//!     `initial_step()` (PyTorch's `__init__` does the same: `last_epoch` is 0 after it);
//!   - override `get_lr()`: the rates at the already advanced `last_epoch()`, in PyTorch's chainable form (from
//!     `current_lrs()`, the groups' rates, usually `accel::scaled(current_lrs(), factor)`) or from `base_lrs()`;
//!     `is_initial_step()` is true during the constructor's step;
//!   - optionally override `closed_form_lr()` (PyTorch's `_get_closed_form_lr`, used when SequentialLR restarts it);
//!   - list the state to save in `fields(accel::StateIO& io)`: call `ExactScheduler::fields(io)` first, then
//!     `io("name", member)` per field (`io("name", member, accel::Bounds<T>{least, most})` to refuse a loaded value
//!     outside what the constructor accepts). `save`/`load` then carry it.
class ExactScheduler : public torch::optim::LRScheduler, public detail::SavedFields<ExactScheduler> {
  friend class detail::SavedFields<ExactScheduler>;

 public:
  //! The rates of the last step (PyTorch's `get_last_lr()`).
  [[nodiscard]] const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  //! Steps taken since construction (0 right after it; PyTorch's `last_epoch`).
  [[nodiscard]] std::int64_t last_epoch() const noexcept { return last_epoch_; }
  //! PyTorch's `_step_count`: 1 after construction, +1 per step.
  [[nodiscard]] std::int64_t step_count() const noexcept { return step_count_py_; }
  //! The groups' initial rates (PyTorch's `base_lrs`).
  [[nodiscard]] const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  //! The optimizer whose groups' rates this scheduler sets.
  [[nodiscard]] torch::optim::Optimizer& optimizer() const noexcept { return opt_; }
  //! The groups' current rates (PyTorch's `[group["lr"] for group in optimizer.param_groups]`).
  [[nodiscard]] std::vector<double> current_lrs() const {
    std::vector<double> out;
    for (const auto& g : opt_.param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  //! True during the step the constructor takes (PyTorch's `_is_initial`).
  [[nodiscard]] bool is_initial_step() const noexcept { return is_initial_; }

  // save / load (detail::SavedFields): everything PyTorch's `state_dict()` holds for this scheduler, the
  // hyperparameters too (PyTorch's `load_state_dict` restores them, so a loaded scheduler goes on with the saved ones).

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
      detail::require(
          initial_ && initial_->size() == opt.param_groups().size(),
          "accel: a scheduler resumed with last_epoch >= 0 needs the groups' initial rates, which a scheduler "
          "built on this optimizer with last_epoch = -1 sets (PyTorch's 'initial_lr' KeyError); to resume, "
          "build with -1 and load() the saved state");
    }
    base_lrs_ = *initial_;
    last_epoch_ = last_epoch;
  }
  //! SequentialLR's: no base rates, no initial step of its own.
  struct Bare {};
  //! SequentialLR's and ChainedScheduler's constructor: no base rates, no initial step.
  ExactScheduler(torch::optim::Optimizer& opt, Bare) : torch::optim::LRScheduler(opt), opt_(opt) {}

  //! PyTorch's `get_lr()`: the rates at `last_epoch`, usually from the groups' current rates.
  virtual std::vector<double> get_lr() = 0;
  //! PyTorch's `_get_closed_form_lr()`, for the schedulers that have one (used when SequentialLR restarts one).
  [[nodiscard]] virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  //! The state `save` writes and `load` reads, each field listed once; derived classes add theirs.
  virtual void fields(StateIO& io) {
    io("last_epoch", last_epoch_, Bounds<std::int64_t>{-1});
    io("step_count", step_count_py_, Bounds<std::int64_t>{0});
    io.per_group("base_lrs", base_lrs_, opt_.param_groups().size());
    io.per_group("last_lr", last_lr_, opt_.param_groups().size());
  }

  // [torch:optim/lr_scheduler.py LRScheduler._initial_step]
  //! The step a constructor takes last (PyTorch's `_initial_step`): `last_epoch` -1 becomes 0 and the rates of epoch 0
  //! are set; `is_initial_step()` is true meanwhile.
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
  //! What `step()` does (PyTorch's `LRScheduler.step`): counts the step and sets the next rates (`update_lr`).
  //! Overridden by schedulers that step otherwise (CosineAnnealingWarmRestarts, SequentialLR, ChainedScheduler).
  virtual void advance() {
    ++step_count_py_;
    update_lr(std::nullopt);
  }
  // [torch:optim/lr_scheduler.py LRScheduler._update_lr]
  //! PyTorch's `_update_lr`: without `epoch`, the next epoch's rates from `get_lr()`; with one, that epoch's rates from
  //! `closed_form_lr()` where there is one (else `get_lr()`). Sets them in the groups and in `get_last_lr()`.
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

  //! The optimizer whose groups' rates this scheduler sets.
  torch::optim::Optimizer& opt_;
  //! The groups' initial rates, shared by every scheduler of the optimizer (PyTorch's `initial_lr` of each group).
  std::shared_ptr<std::vector<double>> initial_;
  //!@{
  //! PyTorch's `base_lrs` (the initial rates) and `_last_lr` (the rates of the last step).
  std::vector<double> base_lrs_, last_lr_;
  //!@}
  //! PyTorch's `last_epoch`: -1 before the initial step, then the steps taken.
  std::int64_t last_epoch_ = -1;
  //! PyTorch's `_step_count`.
  std::int64_t step_count_py_ = 0;
  //! PyTorch's `_is_initial`: true during the constructor's step.
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

}  // namespace accel
