#pragma once
//! \file
//! `PreparedModel<Holder>`: what `Accelerator::prepare` returns for a model when several processes may run.
//! It keeps the user's own module holder (`std::shared_ptr<Net>` or a `TORCH_MODULE` holder such as
//! `torch::nn::Sequential`) and the `DistributedModule` that averages its gradients, and reads like the
//! holder: `model->forward(x)`, `model(x)`, `*model`. Under `dist::none` `prepare` returns the holder itself
//! (nothing to wrap, nothing to pay).

#include <accel/model/distributed_module.hpp>
#include <accel/state/gradient_state.hpp>

#include <ATen/core/grad_mode.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

namespace accel {

namespace detail {
template <class T>
struct shared_module : std::false_type {};
template <class M>
requires std::derived_from<M, torch::nn::Module>
struct shared_module<std::shared_ptr<M>> : std::true_type {
};
}  // namespace detail

//! What users hold a LibTorch module by: `std::shared_ptr<M>` (M derived from `torch::nn::Module`), or a
//! `torch::nn::ModuleHolder` (`torch::nn::Linear`, `torch::nn::Sequential`, a `TORCH_MODULE(Net)`).
template <class H>
concept ModuleHandle = detail::shared_module<H>::value || requires(const H& h) {
  typename H::ContainedType;
  requires std::derived_from<typename H::ContainedType, torch::nn::Module>;
  { h.ptr() } -> std::convertible_to<std::shared_ptr<typename H::ContainedType>>;
};

//! The `torch::nn::Module` behind a handle.
template <ModuleHandle H>
std::shared_ptr<torch::nn::Module> module_of(const H& h) {
  if constexpr (detail::shared_module<H>::value)
    return h;
  else
    return h.ptr();
}

//! What `Accelerator::prepare` returns for a model when several processes may run: the user's module holder and the
//! `DistributedModule` that averages its gradients. Reads like the holder (`model->`, `*model`); call it as `model(x)`,
//! the one door where the forward is bracketed as DDP does.
template <ModuleHandle Holder>
class PreparedModel {
 public:
  //! The user's holder and the `DistributedModule` around its module (`prepare` makes it).
  PreparedModel(Holder holder, std::shared_ptr<DistributedModule> distributed)
      : holder_(std::move(holder)), ddp_(std::move(distributed)) {}

  //! The module (non-const, as through the user's holder: a handle's constness is not the module's).
  [[nodiscard]] auto* get() const noexcept {
    if constexpr (detail::shared_module<Holder>::value)
      return holder_.get();
    else
      return holder_.ptr().get();
  }
  //! The module's members, as through the holder (`model->forward(x)`, `model->parameters()`).
  [[nodiscard]] auto* operator->() const noexcept { return get(); }
  //! The module.
  [[nodiscard]] auto& operator*() const noexcept { return *get(); }
  //! `model(x...)` is `model->forward(x...)`, bracketed as DDP brackets it: rank 0's buffers first when due
  //! (`DistributedOptions::broadcast_buffers`). The one door into the model: call it this way, not
  //! `model->forward(x)`; where the bracket matters, a backward after a forward that bypassed it is an error.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    const bool grad = at::GradMode::is_enabled();
    // A rank out of batches takes part in the buffers' broadcast (Note [Joined steps]); what the forward itself
    // issues goes through the door after it, in the order it ran.
    return GradientState::joined(
        ddp_->broadcast_due() ? GradientState::CallKind::collective : GradientState::CallKind::local,
        [&]() -> decltype(auto) {
          ddp_->before_forward();
          try {
            decltype(auto) out = get()->forward(cast_input(std::forward<Args>(args))...);
            ddp_->after_forward(grad);
            if constexpr (std::is_same_v<decltype(out), at::Tensor>) cast_output(out);
            return out;
          } catch (...) {
            ddp_->forward_failed();  // under full sharding: a failed gather's own error, not the operator's
            throw;
          }
        },
        [&] {
          return [d = ddp_, grad, broadcasts = ddp_->broadcasts_buffers()] {
            if (!broadcasts) return;
            d->before_forward();
            d->after_forward(grad);
          };
        });
  }
  //! The user's holder, unwrapped (Accelerate's `unwrap_model`). By value: a holder is a shared handle, and a
  //! copy lets `unwrap()->eval()` compile where a `const Holder&` would give `ModuleHolder`'s const `operator->`.
  [[nodiscard]] Holder unwrap() const noexcept { return holder_; }
  //! The gradient synchroniser (buckets, `no_sync`).
  [[nodiscard]] DistributedModule& distributed() const noexcept { return *ddp_; }
  //! The `DistributedModule`, shared.
  [[nodiscard]] const std::shared_ptr<DistributedModule>& distributed_ptr() const noexcept { return ddp_; }

 private:
  // Full sharding's mixed precision (`MixedPrecisionPolicy::cast_forward_inputs`): a floating-point tensor given to
  // the model is cast to the parameters' compute dtype. A tensor passed as a non-const lvalue (a `forward` taking
  // `Tensor&`) is passed as it is.
  template <class A>
  decltype(auto) cast_input(A&& a) const {
    if constexpr (std::is_same_v<std::remove_cvref_t<A>, at::Tensor> &&
                  !(std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>>)) {
      if (const auto& s = ddp_->sharder())
        if (const auto t = s->input_dtype(); t && a.defined() && a.is_floating_point() && a.scalar_type() != *t)
          return at::Tensor(a.to(*t));
      return at::Tensor(std::forward<A>(a));
    } else {
      return std::forward<A>(a);
    }
  }
  // `MixedPrecisionPolicy::output_dtype`: a floating-point tensor output cast to it.
  void cast_output(at::Tensor& out) const {
    if (const auto& s = ddp_->sharder())
      if (const auto t = s->options().mp_policy.output_dtype; t && out.defined() && out.is_floating_point())
        out = out.to(*t);
  }

  Holder holder_;
  std::shared_ptr<DistributedModule> ddp_;
};

//! Whether `T` is a `PreparedModel`.
template <class T>
inline constexpr bool is_prepared_model = false;
//! A `PreparedModel`.
template <class H>
inline constexpr bool is_prepared_model<PreparedModel<H>> = true;

//! Accelerate's `unwrap_model`: the user's holder behind a prepared model (a plain holder is returned as is).
//! By value (a copy of the handle, sharing the module), so `unwrap_model(model)->eval()` / `->train()` compile.
template <class M>
requires ModuleHandle<M> || is_prepared_model<M>
auto unwrap_model(const M& model) {
  if constexpr (is_prepared_model<M>)
    return model.unwrap();
  else
    return model;
}

}  // namespace accel
