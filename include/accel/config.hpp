#pragma once
//! \file
//! `Config<Policies...>`: the policies of an `Accelerator`, resolved into one plain struct.
//!
//! \code
//! using C = accel::Config<accel::batches::split, accel::dist::gloo>;
//! static_assert(C::split_batches && C::even_batches && !C::dispatch);
//! static_assert(std::same_as<C::dist, accel::dist::gloo>);
//! \endcode
//!
//! Policies may come in any order; a missing slot takes its default:
//! `dist::from_env`, `batches::per_process`, `tail::even`, `loading::sharded`, `place::device`, and
//! `shard::none`, `rng::sync<rng::generator>` (or `rng::none` under `loading::dispatched`, where only rank 0 samples).
//! Whether the combination is valid is `diagnose<Policies...>()`; `Accelerator` turns a problem into one
//! `static_assert` that names it and says how to fix it.

#include <accel/detail/cuda_build.hpp>
#include <accel/detail/resolve.hpp>
#include <accel/policy/batches.hpp>
#include <accel/policy/dist.hpp>
#include <accel/policy/loading.hpp>
#include <accel/policy/place.hpp>
#include <accel/policy/rng.hpp>
#include <accel/policy/shard.hpp>
#include <accel/policy/slots.hpp>
#include <accel/policy/tail.hpp>

#include <type_traits>

namespace accel {

namespace detail {

template <class Rng>
struct rng_kinds;
template <class... Ks>
struct rng_kinds<rng::sync<Ks...>> {
  template <class K>
  static constexpr int count = (0 + ... + int(std::is_same_v<K, Ks>));
  static constexpr bool all_known = (rng::Kind<Ks> && ...);
  static constexpr bool unique = ((count<Ks> == 1) && ...);
  static constexpr bool empty = sizeof...(Ks) == 0;
};
template <>
struct rng_kinds<rng::none> {
  template <class K>
  static constexpr int count = 0;
  static constexpr bool all_known = true, unique = true, empty = true;
};

}  // namespace detail

//! Policies resolved: one type per slot plus the flags the rest of the library reads.
template <class... Ps>
struct Config {
  //! The `dist` policy (default `dist::from_env`).
  using dist = detail::pick_t<slot::distributed, accel::dist::from_env, Ps...>;
  //! The `batches` policy (default `batches::per_process`).
  using batching = detail::pick_t<slot::batching, batches::per_process, Ps...>;
  //! The `tail` policy (default `tail::even`).
  using tail = detail::pick_t<slot::tail, accel::tail::even, Ps...>;
  //! The `loading` policy (default `loading::sharded`).
  using loading = detail::pick_t<slot::loading, accel::loading::sharded, Ps...>;
  //! The `rng` policy (default `rng::sync<rng::generator>`, `rng::none` under `loading::dispatched`).
  using rng = detail::pick_t<slot::rng,
                             std::conditional_t<std::is_same_v<loading, accel::loading::dispatched>, accel::rng::none,
                                                accel::rng::sync<accel::rng::generator>>,
                             Ps...>;
  //! The `place` policy (default `place::device`).
  using place = detail::pick_t<slot::placement, accel::place::device, Ps...>;
  //! The `shard` policy (default `shard::none`).
  using shard = detail::pick_t<slot::sharding, accel::shard::none, Ps...>;

  //! Accelerate's `split_batches`.
  static constexpr bool split_batches = std::is_same_v<batching, batches::split>;
  //! Accelerate's `even_batches`.
  static constexpr bool even_batches = std::is_same_v<tail, accel::tail::even>;
  //! Accelerate's `dispatch_batches`.
  static constexpr bool dispatch = std::is_same_v<loading, accel::loading::dispatched>;
  //! Whether the default CPU generator is synchronised each epoch (`rng::torch`).
  static constexpr bool sync_torch_rng = detail::rng_kinds<rng>::template count<accel::rng::torch> > 0;
  //! Whether the default GPU generator is synchronised each epoch (`rng::cuda`).
  static constexpr bool sync_cuda_rng = detail::rng_kinds<rng>::template count<accel::rng::cuda> > 0;
  //! Whether the loaders' sampler generators are synchronised each epoch (`rng::generator`).
  static constexpr bool sync_generator = detail::rng_kinds<rng>::template count<accel::rng::generator> > 0;
  //! Accelerate's `device_placement`.
  static constexpr bool device_placement = !std::is_same_v<place, accel::place::none>;
  //! `place::async`: non-blocking copies on a side stream.
  static constexpr bool async_placement = std::is_same_v<place, accel::place::async>;
  //! The ZeRO stage: 0 (`shard::none`), 1 (`shard::optimizer`), 2 (`shard::gradients`) or 3 (`shard::parameters`).
  static constexpr int zero_stage = std::is_same_v<shard, accel::shard::parameters>  ? 3
                                    : std::is_same_v<shard, accel::shard::gradients> ? 2
                                    : std::is_same_v<shard, accel::shard::optimizer> ? 1
                                                                                     : 0;
};

//! What is wrong with a list of policies (the first problem found), or `none`.
enum class ConfigProblem {
  none,
  not_a_policy,
  duplicate_distributed,
  duplicate_batching,
  duplicate_tail,
  duplicate_loading,
  duplicate_rng,
  duplicate_placement,
  duplicate_sharding,
  rng_sync_not_a_kind,
  rng_sync_repeated_kind,
  nccl_without_cuda_build,
  rng_cuda_without_cuda_build,
  rng_cuda_without_gpu_engine,
  async_without_cuda_build,
  async_with_gloo,
  dispatched_without_processes,
  dispatched_with_uneven_tail,
  dispatched_with_generator_sync,
  dispatched_without_placement,
  sharding_without_processes,
  gradient_sharding_without_processes,
  parameter_sharding_without_processes,
  parameter_sharding_with_uneven_tail,
};

//! The first problem of a list of policies, or `ConfigProblem::none`: a duplicate slot, an unknown type, a combination
//! that cannot run. `CheckedConfig` turns it into its `static_assert`.
template <class... Ps>
consteval ConfigProblem diagnose() {
  using P = ConfigProblem;
  if (!detail::all_policies<Ps...>) return P::not_a_policy;
  if (detail::count_in_slot < slot::distributed, Ps... >> 1) return P::duplicate_distributed;
  if (detail::count_in_slot < slot::batching, Ps... >> 1) return P::duplicate_batching;
  if (detail::count_in_slot < slot::tail, Ps... >> 1) return P::duplicate_tail;
  if (detail::count_in_slot < slot::loading, Ps... >> 1) return P::duplicate_loading;
  if (detail::count_in_slot < slot::rng, Ps... >> 1) return P::duplicate_rng;
  if (detail::count_in_slot < slot::placement, Ps... >> 1) return P::duplicate_placement;
  if (detail::count_in_slot < slot::sharding, Ps... >> 1) return P::duplicate_sharding;

  using C = Config<Ps...>;
  using kinds = detail::rng_kinds<typename C::rng>;
  constexpr bool explicit_rng = detail::count_in_slot<slot::rng, Ps...> == 1;
  constexpr bool explicit_tail = detail::count_in_slot<slot::tail, Ps...> == 1;
  constexpr bool cpu_engine =
      std::is_same_v<typename C::dist, dist::gloo> || std::is_same_v<typename C::dist, dist::none>;
  if (!kinds::all_known) return P::rng_sync_not_a_kind;
  if (!kinds::unique) return P::rng_sync_repeated_kind;
  if (std::is_same_v<typename C::dist, dist::nccl> && !ACCEL_WITH_CUDA) return P::nccl_without_cuda_build;
  if (C::sync_cuda_rng && !ACCEL_WITH_CUDA) return P::rng_cuda_without_cuda_build;
  if (C::sync_cuda_rng && cpu_engine) return P::rng_cuda_without_gpu_engine;
  if (C::async_placement && !ACCEL_WITH_CUDA) return P::async_without_cuda_build;
  if (C::async_placement && std::is_same_v<typename C::dist, dist::gloo>) return P::async_with_gloo;
  if (C::dispatch && std::is_same_v<typename C::dist, dist::none>) return P::dispatched_without_processes;
  if (C::dispatch && explicit_tail && !C::even_batches) return P::dispatched_with_uneven_tail;
  if (C::dispatch && explicit_rng && C::sync_generator) return P::dispatched_with_generator_sync;
  if (C::dispatch && !C::device_placement) return P::dispatched_without_placement;
  if (C::zero_stage == 1 && std::is_same_v<typename C::dist, dist::none>) return P::sharding_without_processes;
  if (C::zero_stage == 2 && std::is_same_v<typename C::dist, dist::none>) return P::gradient_sharding_without_processes;
  if (C::zero_stage == 3 && std::is_same_v<typename C::dist, dist::none>)
    return P::parameter_sharding_without_processes;
  if (C::zero_stage == 3 && !C::even_batches) return P::parameter_sharding_with_uneven_tail;
  return P::none;
}

//! `Config<Ps...>` with its checks: naming this type with a wrong list of policies stops the build with exactly
//! one `static_assert` that says what is wrong and how to fix it. `Accelerator<Ps...>::config` is this type;
//! use it too when calling `data::prepare_data_loader<Config>` without an Accelerator.
template <class... Ps>
struct CheckedConfig : Config<Ps...> {
  static constexpr ConfigProblem problem = diagnose<Ps...>();  //!< `diagnose<Ps...>()`
  using P = ConfigProblem;                                     //!< shorthand for the assertions

  static_assert(problem != P::not_a_policy,
                "accel::Accelerator<...>: a template argument is not an accel policy; use the tags of accel::dist, "
                "accel::batches, accel::tail, accel::loading, accel::rng, accel::place or accel::shard");
  static_assert(problem != P::duplicate_distributed,
                "accel::Accelerator<...>: two policies fill slot 'distributed' (accel::dist::...); keep one");
  static_assert(problem != P::duplicate_batching,
                "accel::Accelerator<...>: two policies fill slot 'batching' (accel::batches::...); keep one");
  static_assert(problem != P::duplicate_tail,
                "accel::Accelerator<...>: two policies fill slot 'tail' (accel::tail::...); keep one");
  static_assert(problem != P::duplicate_loading,
                "accel::Accelerator<...>: two policies fill slot 'loading' (accel::loading::...); keep one");
  static_assert(problem != P::duplicate_rng,
                "accel::Accelerator<...>: two policies fill slot 'rng' (accel::rng::...); list every kind in one "
                "accel::rng::sync<...>");
  static_assert(problem != P::duplicate_placement,
                "accel::Accelerator<...>: two policies fill slot 'placement' (accel::place::...); keep one");
  static_assert(problem != P::duplicate_sharding,
                "accel::Accelerator<...>: two policies fill slot 'sharding' (accel::shard::...); keep one");
  static_assert(
      problem != P::rng_sync_not_a_kind,
      "accel::rng::sync<...>: every argument must be accel::rng::torch, accel::rng::cuda or accel::rng::generator");
  static_assert(problem != P::rng_sync_repeated_kind,
                "accel::rng::sync<...>: a generator kind is listed twice; list each kind once");
  static_assert(
      problem != P::nccl_without_cuda_build,
      "accel::dist::nccl needs CUDA, but accel is built without it (ACCEL_WITH_CUDA=0); use accel::dist::gloo "
      "or a LibTorch with CUDA");
  static_assert(
      problem != P::rng_cuda_without_cuda_build,
      "accel::rng::cuda needs CUDA, but accel is built without it (ACCEL_WITH_CUDA=0); remove accel::rng::cuda "
      "from accel::rng::sync<...>");
  static_assert(problem != P::rng_cuda_without_gpu_engine,
                "accel::rng::cuda synchronises GPU generators, but the distributed policy is a CPU one (dist::gloo or "
                "dist::none); use accel::dist::nccl or accel::dist::from_env, or drop accel::rng::cuda");
  static_assert(problem != P::async_without_cuda_build,
                "accel::place::async needs CUDA (pinned memory, copy streams), but accel is built without it "
                "(ACCEL_WITH_CUDA=0); use accel::place::device");
  static_assert(problem != P::async_with_gloo,
                "accel::place::async copies to a GPU, but accel::dist::gloo keeps tensors on the CPU; use "
                "accel::place::device, or accel::dist::nccl / accel::dist::from_env");
  static_assert(problem != P::dispatched_without_processes,
                "accel::loading::dispatched sends rank 0's batches to the other processes, but accel::dist::none has "
                "one process; use accel::loading::sharded");
  static_assert(
      problem != P::dispatched_with_uneven_tail,
      "accel::loading::dispatched always gives every process the same number of batches, so accel::tail::uneven "
      "would be ignored; remove it or use accel::loading::sharded");
  static_assert(
      problem != P::dispatched_with_generator_sync,
      "accel::loading::dispatched samples on rank 0 only, so accel::rng::generator has nothing to synchronise; "
      "use accel::rng::none or accel::rng::sync<accel::rng::torch>");
  static_assert(problem != P::dispatched_without_placement,
                "accel::loading::dispatched moves every slice to its process's device, so it needs a placement; use "
                "accel::place::device (the default) instead of accel::place::none");
  static_assert(
      problem != P::sharding_without_processes,
      "accel::shard::optimizer splits the optimizer state across processes, but accel::dist::none has one process; "
      "use accel::dist::gloo, accel::dist::nccl or accel::dist::from_env, or drop accel::shard::optimizer");
  static_assert(
      problem != P::gradient_sharding_without_processes,
      "accel::shard::gradients splits the gradients and the optimizer state across processes, but accel::dist::none "
      "has one process; use accel::dist::gloo, accel::dist::nccl or accel::dist::from_env, or drop "
      "accel::shard::gradients");
  static_assert(problem != P::parameter_sharding_without_processes,
                "accel::shard::parameters splits the parameters, gradients and optimizer state across processes, but "
                "accel::dist::none has one process; use accel::dist::gloo, accel::dist::nccl or accel::dist::from_env, "
                "or drop accel::shard::parameters");
  static_assert(
      problem != P::parameter_sharding_with_uneven_tail,
      "accel::shard::parameters gathers each unit's parameters from every process inside the forward, which a "
      "process out of batches under accel::tail::uneven does not run; use accel::tail::even (the default), or "
      "accel::shard::gradients, whose collectives a process out of batches can repeat");
};

}  // namespace accel
