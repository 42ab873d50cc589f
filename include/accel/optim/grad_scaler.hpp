#pragma once
//! \file
//! `GradScaler`: dynamic loss scaling for fp16 training (PyTorch's `torch.amp.GradScaler`, which LibTorch lacks).
//!
//! - `scale(loss)` multiplies the loss by the current scale S before backward, so small fp16 gradients do not
//!   underflow.
//! - `unscale_(optimizer)` divides the optimizer's gradients by S (once per step: a second call before `update`
//!   is an error) and records whether any gradient is inf/NaN. The finding is summed across processes, so every
//!   process skips the same steps even where gradients were not averaged.
//! - `step(optimizer)` unscales if not yet done, then steps the optimizer unless inf/NaN was found; returns
//!   whether it stepped.
//! - `update()` halves S (`backoff_factor`) after an overflow and resets the growth counter; otherwise counts
//!   the good step and doubles S (`growth_factor`) every `growth_interval` consecutive good steps.
//!
//! The arithmetic runs in PyTorch's own kernels (`_amp_foreach_non_finite_check_and_unscale_`,
//! `_amp_update_scale_`), which exist for CPU and CUDA tensors, so the scaler is tested on the CPU. The
//! `Accelerator` creates one under `Precision::fp16`, which (as in Accelerate) needs a GPU.

#include <accel/comm/communicator.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace accel {

//! The GradScaler's settings, PyTorch's names and defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;          //!< 2^16, PyTorch's default
  double growth_factor = 2.0;           //!< the scale's growth after `growth_interval` good steps
  double backoff_factor = 0.5;          //!< the scale's decrease after an overflow
  std::int64_t growth_interval = 2000;  //!< good steps before the scale grows
};

// [torch:amp/grad_scaler.py GradScaler]
//! Dynamic loss scaling for fp16 training (PyTorch's `torch.amp.GradScaler`): `scale`, `unscale_`, `step`, `update`; an
//! inf/NaN found on any process skips the step on every process (see the file's comment).
class GradScaler {
 public:
  //! A scaler whose scale lives on `device`, the inf/NaN finding summed over `comm`'s processes.
  explicit GradScaler(c10::Device device, comm::Communicator* comm = nullptr, GradScalerOptions o = {})
      : comm_(comm), opt_(o) {
    detail::require(
        o.init_scale > 0 && o.growth_factor > 1.0 && o.backoff_factor > 0 && o.backoff_factor < 1.0 &&
            o.growth_interval >= 1,
        "accel::GradScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1");
    scale_ = at::full({1}, o.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
    growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
  }

  //! The loss times the current scale (same dtype as the loss).
  [[nodiscard]] at::Tensor scale(const at::Tensor& loss) const {
    return loss * scale_.to(loss.device(), /*non_blocking=*/true);
  }

  //! Divides the optimizer's gradients by the scale and records inf/NaN (summed across processes).
  void unscale_(torch::optim::Optimizer& optimizer) {
    auto& st = per_optimizer_[&optimizer];
    detail::require(
        !st.unscaled,
        "accel::GradScaler: unscale_() was already called on this optimizer since the last update(); "
        "call clip_grad_norm_ or clip_grad_value_ (each unscales) at most once per step, on synchronising steps only");
    detail::require(!st.stepped, "accel::GradScaler: unscale_() after step(); unscale before stepping");
    const at::Tensor inv = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
    at::Tensor found = at::zeros({1}, scale_.options());
    // One fused call per (device, dtype) group, as PyTorch does.
    std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> groups;  // (a gradient of the group, its members)
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        detail::require(
            p.grad().scalar_type() != at::kHalf,
            "accel::GradScaler: a parameter has fp16 gradients; keep the model's parameters in fp32 and run the "
            "forward pass under autocast (fp16 master weights cannot be unscaled safely)");
        detail::require(!p.grad().is_sparse(), "accel::GradScaler: sparse gradients are not supported");
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) {
          return e.first.device() == p.grad().device() && e.first.scalar_type() == p.grad().scalar_type();
        });
        if (g == groups.end()) groups.push_back({p.grad(), {}}), g = std::prev(groups.end());
        g->second.push_back(p.grad());
      }
    for (auto& [first, grads] : groups) {
      const c10::Device where = first.device();
      at::Tensor found_here = where == found.device() ? found : at::zeros({1}, scale_.options().device(where));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv.to(where));
      if (!found_here.is_same(found)) found.add_(found_here.to(found.device()));
    }
    if (comm_ && comm_->size() > 1) {
      at::Tensor moving = found.to(comm_->device());
      comm_->all_reduce(moving, comm::ReduceOp::sum);
      found.copy_(moving);
    }
    st.found_inf = found;
    st.unscaled = true;
  }

  //! Unscales if not done yet, then steps `optimizer` unless inf/NaN was found. Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer) {
    return step(optimizer, [&] { optimizer.step(); });
  }
  //! The same, stepping with `step_fn` instead of `optimizer.step()` (a ZeRO partition's step: optim/sharded.hpp);
  //! `optimizer` holds the gradients that are unscaled and checked.
  template <class StepFn>
  bool step(torch::optim::Optimizer& optimizer, StepFn&& step_fn) {
    auto& st = per_optimizer_[&optimizer];
    detail::require(!st.stepped,
                    "accel::GradScaler: step() was already called on this optimizer since the last update()");
    if (!st.unscaled) unscale_(optimizer);
    st.stepped = true;
    if (st.found_inf.item<float>() != 0.0f) return false;
    step_fn();
    return true;
  }

  //! Adjusts the scale from the inf/NaN findings since the last update.
  void update() {
    at::Tensor found;
    for (auto& [opt, st] : per_optimizer_)
      if (st.found_inf.defined())
        found = found.defined() ? found + st.found_inf.to(scale_.device()) : st.found_inf.to(scale_.device());
    detail::require(found.defined(),
                    "accel::GradScaler: update() without an unscale_() or step() since the last update()");
    at::_amp_update_scale_(scale_, growth_tracker_, found, opt_.growth_factor, opt_.backoff_factor,
                           opt_.growth_interval);
    per_optimizer_.clear();
  }

  //! The current scale (PyTorch's `get_scale()`).
  [[nodiscard]] double get_scale() const { return scale_.item<double>(); }
  //! Consecutive good steps since the scale last changed (PyTorch's `_growth_tracker`).
  [[nodiscard]] std::int64_t growth_tracker() const { return growth_tracker_.item<std::int64_t>(); }
  //! The settings.
  [[nodiscard]] const GradScalerOptions& options() const noexcept { return opt_; }

  //! Saves the scale, the growth tracker and the settings (PyTorch's `state_dict`).
  void save(torch::serialize::OutputArchive& a) const {
    a.write("scale", scale_.cpu());
    a.write("growth_tracker", growth_tracker_.cpu());
  }
  //! Restores what `save` wrote; a state `check` refuses changes nothing.
  void load(torch::serialize::InputArchive& a) {
    check(a);
    at::Tensor s, g;
    a.read("scale", s);
    a.read("growth_tracker", g);
    scale_.copy_(s);
    growth_tracker_.copy_(g);
    per_optimizer_.clear();
  }
  //! Refuses (`InvalidArgument` naming the field) a saved state the scaler cannot reach: a scale that is not one
  //! finite positive float, a growth tracker that is not one integer of 0 or more.
  void check(torch::serialize::InputArchive& a) const {
    at::Tensor s, g;
    a.read("scale", s);
    a.read("growth_tracker", g);
    if (s.numel() != 1 || s.scalar_type() != at::kFloat || !std::isfinite(s.item<float>()) || !(s.item<float>() > 0))
      throw InvalidArgument("scaler state 'scale' is " + c10::str(s.sizes()) + " " +
                            std::string(c10::toString(s.scalar_type())) +
                            (s.numel() == 1 ? " of " + std::to_string(s.item<double>()) : std::string()) +
                            " (one finite positive float)");
    if (g.numel() != 1 || g.scalar_type() != at::kInt || g.item<int>() < 0)
      throw InvalidArgument("scaler state 'growth_tracker' is " + c10::str(g.sizes()) + " " +
                            std::string(c10::toString(g.scalar_type())) +
                            (g.numel() == 1 ? " of " + std::to_string(g.item<double>()) : std::string()) +
                            " (one integer, 0 or more: the good steps since the scale last changed)");
  }

 private:
  struct PerOptimizer {
    bool unscaled = false, stepped = false;
    at::Tensor found_inf;
  };
  comm::Communicator* comm_;
  GradScalerOptions opt_;
  at::Tensor scale_, growth_tracker_;
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace accel
