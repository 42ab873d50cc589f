#pragma once
//! \file
//! The training loop's members of `Accelerator` (accelerator.hpp): accumulate, no_sync, backward, clip_grad_norm_,
//! clip_grad_value_, unscale_gradients, autocast, gather_for_metrics, gather, reduce, check_trigger: each through
//! the joined-step door, for a rank that runs out of batches (Note [The joined-step door] in state/gradient_state.hpp).
//! Included by accelerator.hpp.

#include <accel/accelerator.hpp>

#include <ATen/Dispatch.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accel {

template <class... Policies>
template <class... Models>
SyncScope Accelerator<Policies...>::accumulate(const Models&... models) {
  bind_boundary_hook();
  accumulating_ = true;
  return GradientState::joined(
      GradientState::CallKind::accumulate,
      [&] {
        accumulation_.begin_step();
        SyncScope scope;
        if (!accumulation_.allow_sync()) (scope.hold(distributed_of(models).get()), ...);
        return scope;
      },
      [&] { return repeat_accumulate({distributed_of(models)...}); });
}

template <class... Policies>
template <class... Models>
SyncScope Accelerator<Policies...>::no_sync(const Models&... models) {
  return no_sync_of({distributed_of(models)...});
}

template <class... Policies>
void Accelerator<Policies...>::backward(const at::Tensor& loss) {
  check_before_backward();
  auto& gs = GradientState::instance();
  if (std::any_of(ddps_.begin(), ddps_.end(), [](const auto& d) { return d->sync(); }))
    refuse_starved("backward (the gradient all-reduce)");
  const bool recording = gs.recording();
  std::vector<std::uint64_t> before;
  if (recording)
    for (const auto& d : ddps_) before.push_back(d->backward_count());
  GradientState::joined(
      GradientState::CallKind::collective,
      [&] {
        const at::Tensor l =
            opt_.gradient_accumulation_steps > 1 ? loss / double(opt_.gradient_accumulation_steps) : loss;
        try {
          if (scaler_)
            scaler_->scale(l).backward();
          else
            l.backward();
        } catch (...) {
          for (const auto& d : ddps_) d->backward_failed();  // full sharding: a failed gather's own error
          throw;
        }
        for (const auto& d : ddps_)
          if (!d->sync()) d->open_window();  // inside an accumulation window: check_before_backward compares
      },
      [&] {
        Ddps through;  // the prepared models this backward went through: a rank out of batches averages theirs
        for (std::size_t i = 0; i < ddps_.size(); ++i)
          if (ddps_[i]->backward_count() != before[i]) through.push_back(ddps_[i]);
        return [through] {
          for (const auto& d : through) d->synchronize();
        };
      });
}

template <class... Policies>
void Accelerator<Policies...>::check_before_backward() {
  ++backwards_;
  const bool accumulated = std::exchange(accumulating_, false);
  if (opt_.gradient_accumulation_steps > 1 && !accumulated)
    warn_once(Warning::backward_outside_accumulate,
              "gradient_accumulation_steps is " + std::to_string(opt_.gradient_accumulation_steps) +
                  " but backward() ran outside an accumulate() scope: nothing decides the accumulation window, so "
                  "every step synchronises and the optimizer steps on every batch (with the loss divided by " +
                  std::to_string(opt_.gradient_accumulation_steps) +
                  "). Open `auto step = acc.accumulate(model);` "
                  "before each batch's forward, or set gradient_accumulation_steps = 1");
  const std::uint64_t steps = optimizer_steps();
  const bool stepped = steps != steps_at_backward_;  // a prepared optimizer stepped since the last backward
  steps_at_backward_ = steps;
  for (std::size_t m = 0; m < ddps_.size(); ++m) {
    const auto window = ddps_[m]->close_window();
    if (const auto& name = window.changed_parameter; !name.empty() && !stepped)
      warn_once(
          Warning::stepped_outside_accel,
          "parameter '" + name + "' of prepared model " + std::to_string(m) +
              " changed inside an accumulation "
              "window, where its gradients are this process's alone, but no optimizer that prepare() returned has "
              "stepped: an optimizer accel did not prepare (or the raw one behind a prepared optimizer) stepped it, "
              "and the processes' weights drift apart. Step the optimizer prepare() returned "
              "(opt.step(), which steps only when gradients are synchronised). If the loop changes the weights on "
              "purpose, identically on every process, ignore this; Options::check_replicas_every verifies it");
    if (const auto& name = window.cleared_gradient; !name.empty())
      warn_once(
          Warning::cleared_in_window,
          "the gradient of parameter '" + name + "' of prepared model " + std::to_string(m) +
              " was cleared inside an "
              "accumulation window (an optimizer's zero_grad that prepare() did not return): the window's earlier "
              "batches are lost from the step. Call zero_grad() on the optimizer prepare() returned, which clears only "
              "after a synchronising step");
  }
}

template <class... Policies>
void Accelerator<Policies...>::warn_once(Warning which, const std::string& message) {
  const auto bit = 1u << unsigned(which);
  if (warned_ & bit) return;
  warned_ |= bit;
  if (is_main_process()) std::fprintf(stderr, "accel: warning: %s\n", message.c_str());
}

template <class... Policies>
std::uint64_t Accelerator<Policies...>::optimizer_steps() const {
  std::uint64_t steps = 0;
  for (const auto& o : optimizers_) steps = std::max(steps, o.record->steps);
  return steps;
}

template <class... Policies>
std::vector<std::pair<std::string, at::Tensor>> Accelerator<Policies...>::replica_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (std::size_t m = 0; m < ddps_.size(); ++m)
    if (!ddps_[m]->sharder())  // a fully sharded model's processes hold different parts by design
      for (auto& [name, t] : ddps_[m]->named_parameters())
        out.emplace_back(ddps_.size() == 1 ? name : "model " + std::to_string(m) + ": " + name, std::move(t));
  return out;
}

template <class... Policies>
double Accelerator<Policies...>::clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                                                 double norm_type) {
  return GradientState::joined(
      GradientState::CallKind::local,
      [&] {
        unscale_gradients();
        if constexpr (config::zero_stage >= 2) {
          auto [parts, whole] = gradients_of(parameters);
          return clip_partitioned_norm(state_.comm(), parts, whole, max_norm, norm_type);
        }
        return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
      },
      [&] {  // a rank out of batches clips on synchronising steps, where its gradients are the others' average
        return [this, parameters, max_norm, norm_type] {
          if (sync_gradients()) clip_grad_norm_(parameters, max_norm, norm_type);
        };
      });
}

template <class... Policies>
template <class M>
requires ModuleHandle<M> || is_prepared_model<M>
double Accelerator<Policies...>::clip_grad_norm_(const M& model, double max_norm, double norm_type) {
  return clip_grad_norm_(module_of(unwrap_model(model))->parameters(), max_norm, norm_type);
}

template <class... Policies>
void Accelerator<Policies...>::clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value) {
  GradientState::joined(
      GradientState::CallKind::local,
      [&] {
        unscale_gradients();
        if constexpr (config::zero_stage >= 2) {
          auto [parts, whole] = gradients_of(parameters);
          for (auto& g : parts) g.clamp_(-clip_value, clip_value);
          for (auto& g : whole) g.clamp_(-clip_value, clip_value);
          return;
        }
        torch::nn::utils::clip_grad_value_(parameters, clip_value);
      },
      [&] {  // a rank out of batches clips on synchronising steps, where its gradients are the others' average
        return [this, parameters, clip_value] {
          if (sync_gradients()) clip_grad_value_(parameters, clip_value);
        };
      });
}

template <class... Policies>
template <class M>
requires ModuleHandle<M> || is_prepared_model<M>
void Accelerator<Policies...>::clip_grad_value_(const M& model, double clip_value) {
  clip_grad_value_(module_of(unwrap_model(model))->parameters(), clip_value);
}

template <class... Policies>
void Accelerator<Policies...>::unscale_gradients() {
  if (scaler_)
    for (auto& o : optimizers_) scaler_->unscale_(o.sharded ? o.sharded->gradient_holder() : *o.optimizer);
}

template <class... Policies>
AutocastScope Accelerator<Policies...>::autocast() const {
  const auto dtype = opt_.mixed_precision == Precision::fp16 ? at::kHalf : at::kBFloat16;
  return {state_.device().type(), dtype, opt_.mixed_precision != Precision::no};
}

template <class... Policies>
template <TensorStructure T>
T Accelerator<Policies...>::gather_for_metrics(const T& x) const {
  // not a step call: outside a loader's loop, where no rank records
  if (!GradientState::instance().in_dataloader()) return accel::gather(state_.comm(), x);
  return gather_batch(x, [&x] {
    return map_tensors(x, [](const at::Tensor& t) {  // this rank's rows at a step it lacks
      auto shape = t.sizes().vec();
      if (shape.empty())
        shape.push_back(0);
      else
        shape[0] = 0;
      return at::empty(shape, t.options());
    });
  });
}

template <class... Policies>
template <class T>
requires(!TensorStructure<std::vector<T>>) std::vector<T> Accelerator<Policies...>::gather_for_metrics(
    const std::vector<T>& x)
const {
  // not a step call: outside a loader's loop, where no rank records
  if (!GradientState::instance().in_dataloader()) return concat_rows(accel::gather_object(state_.comm(), x));
  return gather_batch(x, [] { return std::vector<T>{}; });
}

template <class... Policies>
template <TensorStructure T>
T Accelerator<Policies...>::gather(const T& x) const {
  refuse_starved("gather");
  return GradientState::joined(
      GradientState::CallKind::collective, [&] { return accel::gather(state_.comm(), x); },
      [&] {
        return [this, zeros = map_tensors(x, [](const at::Tensor& t) { return at::zeros_like(t); })] {
          (void)gather(zeros);
        };
      });
}

template <class... Policies>
template <TensorStructure T>
T Accelerator<Policies...>::reduce(const T& x, Reduction op, double scale) const {
  refuse_starved("reduce");
  return GradientState::joined(
      GradientState::CallKind::collective, [&] { return accel::reduce(state_.comm(), x, op, scale); },
      [&] {
        return
            [this, op, scale, identity = map_tensors(x, [op](const at::Tensor& t) { return identity_like(t, op); })] {
              (void)reduce(identity, op, scale);
            };
      });
}

template <class... Policies>
bool Accelerator<Policies...>::check_trigger() {
  if (state_.comm() == nullptr) return std::exchange(trigger_, 0) != 0;
  refuse_starved("check_trigger");
  return GradientState::joined(
      GradientState::CallKind::collective,
      [&] {
        const bool any = reduce_flag(trigger_, Reduction::sum) > 0;
        if (any) trigger_ = 0;
        return any;
      },
      [&] {
        return [this] {
          if (check_trigger()) GradientState::instance().stop_repeating();  // the others leave their loops here
        };
      });
}

template <class... Policies>
bool Accelerator<Policies...>::optimizer_step_was_skipped() const {
  for (const auto& o : optimizers_)
    if (o.record->skipped) return true;
  return false;
}

template <class... Policies>
GradientState::StepCall Accelerator<Policies...>::repeat_accumulate(Ddps ddps) {
  return [this, ddps = std::move(ddps)] {
    accumulation_.begin_step();
    auto scope = std::make_shared<SyncScope>();
    if (!accumulation_.allow_sync())
      for (const auto& d : ddps) scope->hold(d.get());
    return scope;
  };
}

template <class... Policies>
SyncScope Accelerator<Policies...>::no_sync_of(const Ddps& ddps) {
  // Repeated as it ran: held from here until the scope ended (its end goes through the door too). The slot is
  // made only while this rank's calls are recorded (the repeat is made then alone).
  std::shared_ptr<std::shared_ptr<SyncScope>> slot;
  SyncScope scope = GradientState::joined(
      GradientState::CallKind::local,
      [&] {
        SyncScope held;
        for (const auto& d : ddps) held.hold(d.get());
        return held;
      },
      [&] {
        slot = std::make_shared<std::shared_ptr<SyncScope>>();
        return [this, ddps, slot] { *slot = std::make_shared<SyncScope>(no_sync_of(ddps)); };
      });
  if (slot)
    scope.on_release([slot] {
      GradientState::joined(
          GradientState::CallKind::local, [] {}, [&] { return [slot] { slot->reset(); }; });
    });
  return scope;
}

template <class... Policies>
template <class T, class None>
T Accelerator<Policies...>::gather_batch(const T& x, None none) const {
  auto& gs = GradientState::instance();
  refuse_starved("gather_for_metrics");
  // This rank's last batch of an uneven evaluation: the others' rows too (only a recording rank can have one; the
  // check spares every other gather the lock).
  const auto ahead = gs.recording() ? gs.gather_ahead() : std::vector<GatherLayout>{};
  return GradientState::joined(
      GradientState::CallKind::gather_for_metrics,
      [&] {
        T out = accel::gather_for_metrics(state_.comm(), x, gs.layout());
        if (ahead.empty()) return out;
        const T empty = none();
        std::vector<T> parts{std::move(out)};
        for (const auto& layout : ahead) parts.push_back(accel::gather_for_metrics(state_.comm(), empty, layout));
        return concat_rows(std::move(parts));
      },
      [&] { return [this, empty = none()] { (void)gather_for_metrics(empty); }; });
}

template <class... Policies>
template <TensorStructure T>
T Accelerator<Policies...>::concat_rows(const std::vector<T>& parts) {
  std::vector<std::vector<at::Tensor>> columns;
  for (const auto& p : parts) {
    std::size_t i = 0;
    for_each_tensor(p, [&](const at::Tensor& t) {
      if (columns.size() <= i) columns.emplace_back();
      columns[i++].push_back(t);
    });
  }
  std::size_t i = 0;
  return map_tensors(parts.front(), [&](const at::Tensor&) { return at::cat(columns[i++], 0); });
}

template <class... Policies>
template <class U>
requires(!TensorStructure<std::vector<U>>) std::vector<U> Accelerator<Policies...>::concat_rows(
    std::vector<std::vector<U>> parts) {
  std::vector<U> out;
  for (auto& p : parts) std::move(p.begin(), p.end(), std::back_inserter(out));
  return out;
}

template <class... Policies>
void Accelerator<Policies...>::refuse_starved(const char* what) const {
  const int r = GradientState::instance().starved_rank();
  if (r < 0) return;
  throw InvalidArgument("accel: rank " + std::to_string(process_index()) + ": " + what +
                        " in an epoch in which the "
                        "uneven loader (tail::uneven) gives rank " +
                        std::to_string(r) +
                        " no batch at all: a rank "
                        "without a batch has no step to follow, so it cannot take part in the others' collectives. "
                        "Use tail::even, fewer processes or a smaller batch size");
}

template <class... Policies>
at::Tensor Accelerator<Policies...>::identity_like(const at::Tensor& t, Reduction op) {
  if (op != Reduction::max && op != Reduction::min) return at::zeros_like(t);
  at::Tensor out = at::empty_like(t);
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, t.scalar_type(), "accel_identity_like", [&] {
    using L = std::numeric_limits<scalar_t>;
    const scalar_t v = op == Reduction::max ? (L::has_infinity ? scalar_t(-L::infinity()) : L::lowest())
                                            : (L::has_infinity ? L::infinity() : L::max());
    out.fill_(c10::Scalar(v));
  });
  return out;
}

template <class... Policies>
std::int64_t Accelerator<Policies...>::reduce_flag(std::int64_t v, Reduction op) const {
  // not a step call: its callers decide (check_trigger through the door, the step boundary between steps)
  return accel::reduce(state_.comm(), detail::long_tensor(v, state_.comm()->device()), op).item<std::int64_t>();
}

template <class... Policies>
template <class M>
std::shared_ptr<DistributedModule> Accelerator<Policies...>::distributed_of(const M& m) {
  if constexpr (is_prepared_model<M>)
    return m.distributed_ptr();
  else
    return nullptr;  // dist::none: nothing to keep local
}

}  // namespace accel
