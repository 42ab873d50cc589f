#pragma once
//! \file
//! Which LibTorch optimizers ZeRO may shard (`ShardTraits`: state per parameter, update elementwise; specialise it
//! for an optimizer of your own that qualifies), the tensors of their per-parameter states (for consolidating and
//! re-cutting a partition), and the bytes of an optimizer's state.

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace accel {

//! Whether ZeRO may shard optimizer `O` (its state is per parameter, its update elementwise) and the type of its
//! options. Specialise it for an optimizer of your own that qualifies.
template <class O>
struct ShardTraits {
  static constexpr bool per_parameter = false;  //!< unknown optimizers are not sharded
};
//! SGD: state per parameter (the momentum buffer), elementwise update.
template <>
struct ShardTraits<torch::optim::SGD> {
  static constexpr bool per_parameter = true;  //!< ZeRO may shard it
  using Options = torch::optim::SGDOptions;    //!< its options
  using State = torch::optim::SGDParamState;   //!< its per-parameter state
};
//! Adam: state per parameter, elementwise update.
template <>
struct ShardTraits<torch::optim::Adam> {
  static constexpr bool per_parameter = true;  //!< ZeRO may shard it
  using Options = torch::optim::AdamOptions;   //!< its options
  using State = torch::optim::AdamParamState;  //!< its per-parameter state
};
//! AdamW: state per parameter, elementwise update.
template <>
struct ShardTraits<torch::optim::AdamW> {
  static constexpr bool per_parameter = true;   //!< ZeRO may shard it
  using Options = torch::optim::AdamWOptions;   //!< its options
  using State = torch::optim::AdamWParamState;  //!< its per-parameter state
};
//! RMSprop: state per parameter, elementwise update.
template <>
struct ShardTraits<torch::optim::RMSprop> {
  static constexpr bool per_parameter = true;     //!< ZeRO may shard it
  using Options = torch::optim::RMSpropOptions;   //!< its options
  using State = torch::optim::RMSpropParamState;  //!< its per-parameter state
};
//! Adagrad: state per parameter, elementwise update.
template <>
struct ShardTraits<torch::optim::Adagrad> {
  static constexpr bool per_parameter = true;     //!< ZeRO may shard it
  using Options = torch::optim::AdagradOptions;   //!< its options
  using State = torch::optim::AdagradParamState;  //!< its per-parameter state
};

namespace detail {
// Each tensor of a per-parameter state as (value, setter), in a fixed order; and its step count.
template <class F>
void state_tensors(torch::optim::SGDParamState& s, F&& f) {
  f(s.momentum_buffer(), [&](at::Tensor t) { s.momentum_buffer(std::move(t)); });
}
template <class S, class F>
requires std::is_same_v<S, torch::optim::AdamParamState> || std::is_same_v<S, torch::optim::AdamWParamState>
void state_tensors(S& s, F&& f) {
  f(s.exp_avg(), [&](at::Tensor t) { s.exp_avg(std::move(t)); });
  f(s.exp_avg_sq(), [&](at::Tensor t) { s.exp_avg_sq(std::move(t)); });
  f(s.max_exp_avg_sq(), [&](at::Tensor t) { s.max_exp_avg_sq(std::move(t)); });
}
template <class F>
void state_tensors(torch::optim::RMSpropParamState& s, F&& f) {
  f(s.square_avg(), [&](at::Tensor t) { s.square_avg(std::move(t)); });
  f(s.momentum_buffer(), [&](at::Tensor t) { s.momentum_buffer(std::move(t)); });
  f(s.grad_avg(), [&](at::Tensor t) { s.grad_avg(std::move(t)); });
}
template <class F>
void state_tensors(torch::optim::AdagradParamState& s, F&& f) {
  f(s.sum(), [&](at::Tensor t) { s.sum(std::move(t)); });
}
//! How many tensors `state_tensors` visits for state type `S`.
template <class S>
std::int64_t state_tensor_count() {
  S probe;
  std::int64_t n = 0;
  state_tensors(probe, [&](const at::Tensor&, auto&&) { ++n; });
  return n;
}
inline std::int64_t state_step(const torch::optim::SGDParamState&) { return 0; }
inline void set_state_step(torch::optim::SGDParamState&, std::int64_t) {}
template <class S>
std::int64_t state_step(const S& s) {
  return s.step();
}
template <class S>
void set_state_step(S& s, std::int64_t n) {
  s.step(n);
}
}  // namespace detail

//! An optimizer ZeRO may shard (`ShardTraits<O>::per_parameter`).
template <class O>
concept ShardableOptimizer = ShardTraits<O>::per_parameter;

//! Bytes of the per-parameter state tensors of an optimizer of one of the shardable types (0 for another type).
inline std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& o) {
  std::int64_t n = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) n += t.numel() * std::int64_t(t.element_size());
  };
  auto each = [&](const at::Tensor& t, auto&&) { add(t); };
  for (const auto& [key, s] : o.state()) {
    (void)key;
    if (auto* x = dynamic_cast<torch::optim::SGDParamState*>(s.get()))
      detail::state_tensors(*x, each);
    else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s.get()))
      detail::state_tensors(*a, each);
    else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s.get()))
      detail::state_tensors(*w, each);
    else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(s.get()))
      detail::state_tensors(*r, each);
    else if (auto* g = dynamic_cast<torch::optim::AdagradParamState*>(s.get()))
      detail::state_tensors(*g, each);
  }
  return n;
}

}  // namespace accel
