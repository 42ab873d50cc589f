#pragma once
//! \file
//! `Accelerator<Policies...>`: the object a training loop talks to.
//!
//! \code
//! struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::split> {};
//! static_assert(Acc::config::split_batches);
//! \endcode
//!
//! Deriving a named struct (rather than a `using` alias) keeps diagnostics short: they say `Acc`.
//! A wrong configuration stops the build with exactly one of the messages below.

#include <accel/config.hpp>

namespace accel {

template <class... Policies>
class Accelerator {
  static constexpr ConfigProblem problem = diagnose<Policies...>();
  using P = ConfigProblem;

  static_assert(problem != P::not_a_policy,
      "accel::Accelerator<...>: a template argument is not an accel policy; use the tags of accel::dist, "
      "accel::batches, accel::tail, accel::loading, accel::rng or accel::place");
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
  static_assert(problem != P::rng_sync_not_a_kind,
      "accel::rng::sync<...>: every argument must be accel::rng::torch, accel::rng::cuda or accel::rng::generator");
  static_assert(problem != P::rng_sync_repeated_kind,
      "accel::rng::sync<...>: a generator kind is listed twice; list each kind once");
  static_assert(problem != P::nccl_without_cuda_build,
      "accel::dist::nccl needs CUDA, but accel is built without it (ACCEL_WITH_CUDA=0); use accel::dist::gloo "
      "or a LibTorch with CUDA");
  static_assert(problem != P::rng_cuda_without_cuda_build,
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
  static_assert(problem != P::dispatched_with_uneven_tail,
      "accel::loading::dispatched always gives every process the same number of batches, so accel::tail::uneven "
      "would be ignored; remove it or use accel::loading::sharded");
  static_assert(problem != P::dispatched_with_generator_sync,
      "accel::loading::dispatched samples on rank 0 only, so accel::rng::generator has nothing to synchronise; "
      "use accel::rng::none or accel::rng::sync<accel::rng::torch>");
  static_assert(problem != P::dispatched_without_placement,
      "accel::loading::dispatched moves every slice to its process's device, so it needs a placement; use "
      "accel::place::device (the default) instead of accel::place::none");

 public:
  //! The resolved configuration: `config::dist`, `config::split_batches`, `config::dispatch`, ...
  using config = Config<Policies...>;
};

}  // namespace accel
