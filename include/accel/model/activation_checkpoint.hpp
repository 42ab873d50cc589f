#pragma once
//! \file
//! Activation checkpointing (`torch.utils.checkpoint.checkpoint`, Accelerate's FSDP `activation_checkpointing`):
//! a call whose activations are not kept for the backward but computed again there, trading one more forward of
//! the call for the memory of everything it computes.
//!
//! - `accel::activation_checkpoint(fn, args...)` runs `fn(args...)` without recording a graph, keeps only its
//!   tensor arguments, and in the backward runs it again with gradients on (on fresh leaves made of the same
//!   arguments, from the same generator and autocast state) and backpropagates through that recomputation. Results
//!   and gradients are those of the plain call `fn(args...)`, bit for bit on the CPU.
//! - `accel::Checkpointed(module)` (or `accel::checkpointed(module)`) is a module whose forward is the wrapped
//!   module's, through `activation_checkpoint`; it holds the wrapped module's parameters, buffers and submodules under
//!   their own names, so the model's parameter names (its `state_dict`, checkpoints and safetensors files) are those of
//!   the model without checkpointing, as Accelerate's are (it strips torch's `_checkpoint_wrapped_module.`).
//!
//! LibTorch has no module hooks, so nothing can checkpoint a submodule from outside: the user's forward says which
//! calls are checkpointed (Accelerate's FSDP plugin wraps each unit instead; README, "Activation checkpointing").
//!
//! \code
//! // In a forward: each block's activations are recomputed in the backward (the blocks are members: they live
//! // until then).
//! for (auto& block : blocks_)
//!   h = accel::activation_checkpoint([&block](const at::Tensor& x) { return block(x); }, h);
//! // Or in a Sequential, with the names of the plain model ("0.norm.weight", not "0.module.norm.weight"):
//! torch::nn::Sequential net(accel::Checkpointed(Block(512)), accel::Checkpointed(Block(512)),
//!                           torch::nn::Linear(512, 10));
//! \endcode
//!
//! Cost: one more forward of each checkpointed call in the backward, and, while the checkpointed forward runs, the
//! dispatcher's observed path for its operators (Note [What a checkpointed call differentiates]).

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/model/unit_sharder.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

// Note [What a checkpointed call differentiates]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch's reentrant checkpoint differentiates only the call's tensor arguments: the parameters a module uses inside
// get their gradients from a nested `backward` that accumulates into `.grad` in the middle of the outer backward,
// and none at all when no argument requires grad (the first block, fed with data). Its non-reentrant checkpoint
// records the graph and drops the saved tensors through saved-tensor hooks, which LibTorch offers to Python alone.
// Here the forward finds what the call differentiates instead: it runs under no grad with a RecordFunction
// callback on its thread (the dispatcher's observer, which sees every operator's inputs); under no grad, a tensor
// that requires grad can only come from outside the call, so every such input of an operator is one the call
// reads: a parameter, a tensor the callable holds, a tensor inside a non-tensor argument. Those tensors, with the
// tensor arguments, are the inputs of one autograd node (`CheckpointFunction`); its backward recomputes the call
// and returns the gradients of all of them (`torch::autograd::grad`, which accumulates nothing). So:
//
// - every gradient reaches its tensor through the outer backward's own edges, as in the plain call: a parameter's
//   is accumulated by its AccumulateGrad node of the outer graph, and its post-accumulate hooks (DDP's bucket
//   readiness, full sharding's unit completion) run in the outer backward, whose end callback they queue;
// - the output requires grad exactly when the plain call's would (a parameter inside does, the input need not);
// - under full sharding the recomputation reads the unit's parameters again: the sharder gathers the unit there
//   as for any backward (it is armed until the backward ends; Note [Intercepting a unit without module hooks]) and
//   frees it once its gradients are accumulated.
//
// The callback is the calling thread's: operators the call runs on threads of its own are not seen (their tensors
// would get no gradient).
//
// Cost: while the checkpointed forward runs (not the recomputation), each operator's inputs are boxed for the
// callback and looked at; the recomputation is one more forward of the call, with grad.

//! Options of `activation_checkpoint` (`torch.utils.checkpoint.checkpoint`'s keyword arguments).
struct ActivationCheckpointOptions {
  //! torch's `preserve_rng_state`: the CPU generator's state (and the CUDA generator's of each device a tensor
  //! argument is on) is saved before the call and restored for its recomputation, so dropout draws the same mask;
  //! the generators are left as they were before the recomputation. false saves nothing (a call without
  //! randomness).
  bool preserve_rng_state = true;
};

namespace detail {

// What one checkpointed call keeps until its backward: how to run it again and the state to run it in.
struct CheckpointState : torch::CustomClassHolder {
  // Runs the call on `tensors` (its tensor arguments, in order) and returns its tensors.
  virtual std::vector<at::Tensor> run(std::vector<at::Tensor>& tensors) = 0;
  std::vector<at::Tensor> outputs;  // the forward's results, until the node takes them
  std::size_t arguments = 0;        // tensor arguments; the node's inputs are those, then the captured tensors
  // The forward's results as the recomputation must give them again.
  struct Result {
    std::vector<std::int64_t> sizes;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<Result> results;
  // The generators' states before the call (`preserve_rng_state`).
  bool rng = false;
  at::Tensor cpu_rng;
  std::vector<std::pair<c10::Device, at::Tensor>> device_rng;
  // The autocast state of the call (CPU and CUDA).
  bool cpu_autocast = false, cuda_autocast = false, autocast_cache = true;
  at::ScalarType cpu_autocast_dtype = at::kBFloat16, cuda_autocast_dtype = at::kHalf;
};

// The autograd node of a checkpointed call: inputs are the tensor arguments then the captured tensors; it outputs
// the call's tensors (computed before it, under no grad); its backward recomputes the call and differentiates it.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state, at::TensorList arguments,
                                                at::TensorList captured) {
    std::vector<at::Tensor> saved(arguments.begin(), arguments.end());
    saved.insert(saved.end(), captured.begin(), captured.end());
    ctx->save_for_backward(std::move(saved));
    ctx->set_materialize_grads(false);
    ctx->saved_data["accel_checkpoint"] = c10::IValue::make_capsule(state);
    return std::exchange(state->outputs, {});
  }
  ACCEL_DECL static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                            torch::autograd::variable_list grads);
};

// Saves the generators' and autocast's states into `state` (before the call).
ACCEL_DECL void save_call_state(CheckpointState& state, const std::vector<at::Tensor>& arguments, bool rng);
// Runs `state.run(arguments)` under no grad, collecting the tensors that require grad which its operators read
// (Note [What a checkpointed call differentiates]) into `captured`; the results go to `state.outputs`.
ACCEL_DECL void run_capturing(CheckpointState& state, std::vector<at::Tensor>& arguments,
                              std::vector<at::Tensor>& captured);

// An argument of the call as the checkpoint keeps it: a defined tensor by its place among the tensor arguments (the
// node saves the tensor), an undefined one as such, anything else by value.
struct TensorSlot {
  static constexpr std::size_t undefined = std::size_t(-1);
  std::size_t index;
};
template <class A>
inline constexpr bool is_tensor_argument = std::is_same_v<std::remove_cvref_t<A>, at::Tensor>;
template <class A>
using stored_argument = std::conditional_t<is_tensor_argument<A>, TensorSlot, std::decay_t<A>>;

template <class A>
stored_argument<A> store_argument(A&& a, std::vector<at::Tensor>& tensors) {
  if constexpr (is_tensor_argument<A>) {
    if (!a.defined()) return TensorSlot{TensorSlot::undefined};
    tensors.push_back(a);
    return TensorSlot{tensors.size() - 1};
  } else {
    return std::forward<A>(a);
  }
}
inline at::Tensor& pick_argument(TensorSlot s, std::vector<at::Tensor>& tensors, at::Tensor& undefined) {
  return s.index == TensorSlot::undefined ? undefined : tensors[s.index];
}
template <class T>
T& pick_argument(T& value, std::vector<at::Tensor>&, at::Tensor&) {
  return value;
}

// What a checkpointed callable may return: a tensor, a std::tuple of tensors, a std::vector of tensors.
template <class R>
struct checkpoint_result : std::false_type {};
template <>
struct checkpoint_result<at::Tensor> : std::true_type {};
template <>
struct checkpoint_result<std::vector<at::Tensor>> : std::true_type {};
template <class... T>
struct checkpoint_result<std::tuple<T...>> : std::bool_constant<(std::is_same_v<T, at::Tensor> && ...)> {};

template <class R>
std::vector<at::Tensor> result_tensors(R&& r) {
  using D = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<D, at::Tensor>)
    return {std::forward<R>(r)};
  else if constexpr (std::is_same_v<D, std::vector<at::Tensor>>)
    return std::forward<R>(r);
  else
    return std::apply([](auto&&... t) { return std::vector<at::Tensor>{std::forward<decltype(t)>(t)...}; },
                      std::forward<R>(r));
}
template <class R>
R from_tensors(std::vector<at::Tensor>&& v) {
  if constexpr (std::is_same_v<R, at::Tensor>)
    return std::move(v.front());
  else if constexpr (std::is_same_v<R, std::vector<at::Tensor>>)
    return std::move(v);
  else
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return R{std::move(v[I])...}; }
  (std::make_index_sequence<std::tuple_size_v<R>>{});
}

// One checkpointed call: the callable and its non-tensor arguments, kept until the backward.
template <class F, class R, class... Stored>
struct CheckpointCall final : CheckpointState {
  CheckpointCall(F f, std::tuple<Stored...> stored) : fn(std::move(f)), args(std::move(stored)) {}
  std::vector<at::Tensor> run(std::vector<at::Tensor>& tensors) override {
    at::Tensor undefined;
    return std::apply(
        [&](auto&... a) {
          return result_tensors(static_cast<R>(std::invoke(fn, pick_argument(a, tensors, undefined)...)));
        },
        args);
  }
  F fn;
  std::tuple<Stored...> args;
};

}  // namespace detail

//! `torch.utils.checkpoint.checkpoint(fn, *args)`: returns `fn(args...)` without keeping what it computes for the
//! backward; the backward runs it again with grad and backpropagates through that (Note [What a checkpointed call
//! differentiates]). Outputs and gradients equal the plain call's (bit for bit on the CPU in fp32).
//!
//! - `args`: the call's arguments. Each `at::Tensor` is kept (the call's inputs: what the checkpoint saves) and
//!   given to `fn` as a fresh leaf in the recomputation, requiring grad when the argument does (an undefined one
//!   stays undefined); anything else is kept by value (copied) and given to `fn` again. `fn` is kept too, until the
//!   backward, and called with lvalues.
//! - `fn` returns an `at::Tensor`, a `std::tuple` of them or a `std::vector` of them (the call's outputs); what it
//!   captures must live until the backward: a module that is a member by reference (`[&block]`), a local holder by
//!   value (`[block](...) mutable`: a holder's call is not const), never a local by reference.
//! - The parameters and tensors `fn` reads from elsewhere get their gradients (accumulated by the outer backward, so
//!   DDP's and full sharding's hooks see them as in the plain call); they must not change between the forward and
//!   the backward (LibTorch's version check says so where they are saved; a changed module gives other results).
//! - Recomputed in the CPU generator's (and the devices' generators') state and the autocast state of the call
//!   (`ActivationCheckpointOptions::preserve_rng_state`): dropout draws the same mask, autocast casts the same way.
//! - Under no grad (evaluation) it is the plain call.
//! - Errors (`InvalidArgument`): a call that returns no tensor; a recomputation that returns other shapes or types
//!   (`fn` depends on something that changed); a second backward through it without `retain_graph`.
//!
//! \code
//! at::Tensor h = x;
//! for (auto& block : blocks)  // a member: `[&block]`; a local holder: `[block](...) mutable`
//!   h = accel::activation_checkpoint([&block](const at::Tensor& t) { return block(t); }, h);
//! \endcode
template <class Fn, class... Args>
auto activation_checkpoint(const ActivationCheckpointOptions& options, Fn&& fn, Args&&... args) {
  using F = std::decay_t<Fn>;
  if constexpr (!std::is_invocable_v<F&, std::decay_t<Args>&...>) {
    static_assert(
        sizeof(F) == 0,
        "accel::activation_checkpoint(fn, args...): fn must be callable with args as lvalues (it is called again, "
        "on the same arguments, in the backward); take them by const reference");
  } else {
    using R = std::remove_cvref_t<std::invoke_result_t<F&, std::decay_t<Args>&...>>;
    if constexpr (!detail::checkpoint_result<R>::value) {
      static_assert(
          sizeof(R) == 0,
          "accel::activation_checkpoint(fn, args...): fn must return an at::Tensor, a std::tuple of at::Tensor or a "
          "std::vector<at::Tensor> (the tensors the rest of the forward uses); return the tensors and keep "
          "anything else outside the checkpointed call");
    } else {
      if (!at::GradMode::is_enabled()) return static_cast<R>(std::invoke(fn, args...));  // nothing to save
      std::vector<at::Tensor> arguments;
      // Braced: the arguments are stored left to right.
      std::tuple<detail::stored_argument<Args>...> stored{
          detail::store_argument(std::forward<Args>(args), arguments)...};
      auto state = c10::make_intrusive<detail::CheckpointCall<F, R, detail::stored_argument<Args>...>>(
          F(std::forward<Fn>(fn)), std::move(stored));
      detail::save_call_state(*state, arguments, options.preserve_rng_state);
      std::vector<at::Tensor> captured;
      detail::run_capturing(*state, arguments, captured);
      bool differentiable = !captured.empty();
      for (const auto& a : arguments) differentiable = differentiable || a.requires_grad();
      if (!differentiable) return detail::from_tensors<R>(std::exchange(state->outputs, {}));
      state->arguments = arguments.size();
      return detail::from_tensors<R>(
          detail::CheckpointFunction::apply(c10::intrusive_ptr<detail::CheckpointState>(std::move(state)),
                                            at::TensorList(arguments), at::TensorList(captured)));
    }
  }
}

//! `activation_checkpoint(fn, args...)` with the default `ActivationCheckpointOptions` (torch's defaults).
template <class Fn, class... Args>
requires(!std::is_same_v<std::remove_cvref_t<Fn>, ActivationCheckpointOptions>) auto activation_checkpoint(
    Fn&& fn, Args&&... args) {
  return activation_checkpoint(ActivationCheckpointOptions{}, std::forward<Fn>(fn), std::forward<Args>(args)...);
}

namespace detail {
// The forward of a module type that `Checkpointed` wraps: its one `forward` member function (void: none, or several);
// a Sequential's is taken as tensor to tensor.
template <class M, class = void>
struct forward_of {
  using type = void;
};
template <class P>
struct plain_member {
  using type = P;
};
template <class R, class C, class... A>
struct plain_member<R (C::*)(A...) const> {
  using type = R (C::*)(A...);
};
template <class R, class C, class... A>
struct plain_member<R (C::*)(A...) noexcept> {
  using type = R (C::*)(A...);
};
template <class R, class C, class... A>
struct plain_member<R (C::*)(A...) const noexcept> {
  using type = R (C::*)(A...);
};
template <class M>
struct forward_of<M, std::void_t<decltype(&M::forward)>> {
  using type = typename plain_member<decltype(&M::forward)>::type;
};
template <>
struct forward_of<torch::nn::SequentialImpl, void> {
  using type = at::Tensor (torch::nn::SequentialImpl::*)(const at::Tensor&);
};
}  // namespace detail

template <class M, class Forward = typename detail::forward_of<M>::type>
class CheckpointedImpl;

//! The module `Checkpointed` holds: the wrapped module `M` (an `Impl` type, `torch::nn::LinearImpl`), whose
//! `forward` it has (the same signature) and runs through `activation_checkpoint`. Its parameters, buffers and
//! submodules are the wrapped module's, registered under their own names (the wrapped module itself is no submodule of
//! it), so a model's names, `state_dict` and files are those of the model without it; `train`/`eval` reach the wrapped
//! module. `ShardingOptions::unit_if = unit_types<M>()` takes it for an `M` (full sharding's units).
template <class M, class R, class C, class... A>
class CheckpointedImpl<M, R (C::*)(A...)> : public torch::nn::Module, public detail::ModuleWrapper {
 public:
  //! Wraps `module` (shared: the caller's holder and this one are the same module).
  explicit CheckpointedImpl(std::shared_ptr<M> module, ActivationCheckpointOptions options = {})
      : module_(std::move(module)), options_(options) {
    if (!module_)
      throw InvalidArgument("accel::Checkpointed: the module to wrap is empty (a null holder); construct it first");
    for (auto& p : module_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (auto& b : module_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (auto& c : module_->named_children()) register_module(c.key(), c.value());
  }
  //! Wraps the module `holder` holds.
  explicit CheckpointedImpl(const torch::nn::ModuleHolder<M>& holder, ActivationCheckpointOptions options = {})
      : CheckpointedImpl(holder.ptr(), options) {}

  //! The wrapped module's forward on `args`, through `activation_checkpoint` (its activations recomputed in the
  //! backward).
  R forward(A... args) {
    return activation_checkpoint(
        options_, [m = module_](auto&... a) -> R { return m->forward(a...); }, static_cast<A&&>(args)...);
  }
  //! The wrapped module.
  [[nodiscard]] const std::shared_ptr<M>& module() const noexcept { return module_; }
  //! Sets training mode here and in the wrapped module (whose forward may read its own flag).
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_->train(on);
  }
  //! "accel::Checkpointed(" the wrapped module ")".
  void pretty_print(std::ostream& stream) const override {
    stream << "accel::Checkpointed(";
    module_->pretty_print(stream);
    stream << ")";
  }
  //! The wrapped module, for `unit_types` (detail::ModuleWrapper).
  [[nodiscard]] const torch::nn::Module& wrapped() const noexcept override { return *module_; }

 private:
  std::shared_ptr<M> module_;
  ActivationCheckpointOptions options_;
};

//! Catch-all: a module type without one `forward` member function (`ModuleList`, a forward overloaded or a template).
template <class M, class Forward>
class CheckpointedImpl : public torch::nn::Module {
 public:
  //! Takes anything: the message below is the one error.
  template <class... T>
  explicit CheckpointedImpl(T&&...) {}

 private:
  static_assert(
      sizeof(M) == 0,
      "accel::Checkpointed<M>: M must have one non-template forward member function (a Sequential's is "
      "taken as tensor to tensor); for another module, call accel::activation_checkpoint(fn, inputs...) in your own "
      "forward");
};

//! A module holder of `CheckpointedImpl<M>`: `accel::Checkpointed(torch::nn::Linear(4, 4))`,
//! `accel::Checkpointed(block, {.preserve_rng_state = false})`; a `torch::nn::Sequential` or `ModuleList` element
//! like any other (`named_parameters()` gives the wrapped module's names where it stands).
template <class M>
class Checkpointed : public torch::nn::ModuleHolder<CheckpointedImpl<M>> {
 public:
  using torch::nn::ModuleHolder<CheckpointedImpl<M>>::ModuleHolder;
  //! Wraps the module `holder` holds.
  Checkpointed(const torch::nn::ModuleHolder<M>& holder, ActivationCheckpointOptions options = {})
      : torch::nn::ModuleHolder<CheckpointedImpl<M>>(std::make_shared<CheckpointedImpl<M>>(holder, options)) {}
  //! Wraps `module`.
  Checkpointed(std::shared_ptr<M> module, ActivationCheckpointOptions options = {})
      : torch::nn::ModuleHolder<CheckpointedImpl<M>>(
            std::make_shared<CheckpointedImpl<M>>(std::move(module), options)) {}
};
//! `Checkpointed(torch::nn::Linear(...))` is a `Checkpointed<torch::nn::LinearImpl>`.
template <class H>
Checkpointed(const torch::nn::ModuleHolder<H>&) -> Checkpointed<H>;
//! With options.
template <class H>
Checkpointed(const torch::nn::ModuleHolder<H>&, ActivationCheckpointOptions) -> Checkpointed<H>;
//! From a module's shared pointer.
template <class M>
Checkpointed(std::shared_ptr<M>) -> Checkpointed<M>;
//! From a module's shared pointer, with options.
template <class M>
Checkpointed(std::shared_ptr<M>, ActivationCheckpointOptions) -> Checkpointed<M>;

//! `Checkpointed(module, options)` as a function: `torch::nn::Sequential(accel::checkpointed(Block(64)), ...)`.
template <class H>
auto checkpointed(const torch::nn::ModuleHolder<H>& module, ActivationCheckpointOptions options = {}) {
  return Checkpointed<H>(module, options);
}

}  // namespace accel

#if ACCEL_DEFINITIONS
#include <accel/model/impl/activation_checkpoint.ipp>
#endif
