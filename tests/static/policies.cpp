// Policy resolution, checked entirely at compile time: compiling this file is the test.
#include <accel/config.hpp>

#include <concepts>

namespace {
using namespace accel;
using accel::ConfigProblem;

// ---- defaults: an empty pack fills every slot ---------------------------------------------------------
using D = Config<>;
static_assert(std::same_as<D::dist, dist::from_env>);
static_assert(std::same_as<D::batching, batches::per_process>);
static_assert(std::same_as<D::tail, tail::even>);
static_assert(std::same_as<D::loading, loading::sharded>);
static_assert(std::same_as<D::rng, rng::sync<rng::generator>>);
static_assert(std::same_as<D::place, place::device>);
static_assert(!D::split_batches && D::even_batches && !D::dispatch && D::device_placement && !D::async_placement);
static_assert(D::sync_generator && !D::sync_torch_rng && !D::sync_cuda_rng);
static_assert(diagnose<>() == ConfigProblem::none);

// ---- every slot, every tag ---------------------------------------------------------------------------
static_assert(std::same_as<Config<dist::none>::dist, dist::none>);
static_assert(std::same_as<Config<dist::gloo>::dist, dist::gloo>);
static_assert(std::same_as<Config<dist::from_env>::dist, dist::from_env>);
static_assert(Config<batches::split>::split_batches && !Config<batches::per_process>::split_batches);
static_assert(!Config<tail::uneven>::even_batches && Config<tail::even>::even_batches);
static_assert(Config<loading::dispatched>::dispatch && !Config<loading::sharded>::dispatch);
static_assert(!Config<place::none>::device_placement && Config<place::device>::device_placement);
static_assert(Config<rng::sync<rng::torch, rng::generator>>::sync_torch_rng);
static_assert(Config<rng::sync<rng::torch, rng::generator>>::sync_generator);
static_assert(!Config<rng::sync<rng::torch>>::sync_generator);
static_assert(!Config<rng::none>::sync_generator && !Config<rng::none>::sync_torch_rng);
static_assert(!Config<rng::sync<>>::sync_generator);
// Dispatched loading samples on rank 0 only, so its rng default is none.
static_assert(std::same_as<Config<loading::dispatched>::rng, rng::none>);
static_assert(std::same_as<Config<loading::dispatched, rng::sync<rng::torch>>::rng, rng::sync<rng::torch>>);

// ---- order independence ------------------------------------------------------------------------------
using A = Config<dist::gloo, batches::split, tail::uneven, loading::sharded, rng::sync<rng::torch>, place::none>;
using B = Config<place::none, rng::sync<rng::torch>, loading::sharded, tail::uneven, batches::split, dist::gloo>;
using C = Config<tail::uneven, place::none, dist::gloo, rng::sync<rng::torch>, batches::split, loading::sharded>;
template <class X, class Y>
constexpr bool same_config =
    std::same_as<typename X::dist, typename Y::dist>&& std::same_as<typename X::batching, typename Y::batching>&&
        std::same_as<typename X::tail, typename Y::tail>&& std::same_as<typename X::loading, typename Y::loading>&&
            std::same_as<typename X::rng, typename Y::rng>&& std::same_as<typename X::place, typename Y::place>;
static_assert(same_config<A, B> && same_config<B, C>);
static_assert(same_config<Config<batches::split>, Config<batches::split, dist::from_env, tail::even>>);

// ---- CheckedConfig (Accelerator<...>::config) is the resolved config, checked ------------------------
using Acc = CheckedConfig<batches::split, dist::gloo>;
static_assert(std::same_as<Acc::dist, dist::gloo> && Acc::split_batches && Acc::problem == ConfigProblem::none);
using Dispatching = CheckedConfig<loading::dispatched, dist::gloo>;
static_assert(Dispatching::dispatch);

// ---- every diagnosis (the messages themselves are checked by tests/fail) -----------------------------
static_assert(!Policy<int> && !Policy<rng::torch> && Policy<rng::none>);
static_assert(diagnose<int>() == ConfigProblem::not_a_policy);
static_assert(diagnose<dist::gloo, dist::none>() == ConfigProblem::duplicate_distributed);
static_assert(diagnose<batches::split, batches::split>() == ConfigProblem::duplicate_batching);
static_assert(diagnose<tail::even, tail::uneven>() == ConfigProblem::duplicate_tail);
static_assert(diagnose<loading::sharded, loading::dispatched>() == ConfigProblem::duplicate_loading);
static_assert(diagnose<rng::none, rng::sync<rng::torch>>() == ConfigProblem::duplicate_rng);
static_assert(diagnose<place::none, place::device>() == ConfigProblem::duplicate_placement);
static_assert(diagnose<rng::sync<int>>() == ConfigProblem::rng_sync_not_a_kind);
static_assert(diagnose<rng::sync<rng::torch, rng::torch>>() == ConfigProblem::rng_sync_repeated_kind);
static_assert(diagnose<rng::sync<rng::cuda>, dist::gloo>() == (ACCEL_WITH_CUDA
                                                                   ? ConfigProblem::rng_cuda_without_gpu_engine
                                                                   : ConfigProblem::rng_cuda_without_cuda_build));
static_assert(diagnose<place::async, dist::gloo>() ==
              (ACCEL_WITH_CUDA ? ConfigProblem::async_with_gloo : ConfigProblem::async_without_cuda_build));
static_assert(diagnose<dist::nccl>() ==
              (ACCEL_WITH_CUDA ? ConfigProblem::none : ConfigProblem::nccl_without_cuda_build));
static_assert(diagnose<loading::dispatched, dist::none>() == ConfigProblem::dispatched_without_processes);
static_assert(diagnose<loading::dispatched, tail::uneven>() == ConfigProblem::dispatched_with_uneven_tail);
static_assert(diagnose<loading::dispatched, tail::even>() == ConfigProblem::none);
static_assert(diagnose<loading::dispatched, rng::sync<rng::generator>>() ==
              ConfigProblem::dispatched_with_generator_sync);
static_assert(diagnose<loading::dispatched, place::none>() == ConfigProblem::dispatched_without_placement);
static_assert(diagnose<tail::uneven, batches::split, place::none>() == ConfigProblem::none);
// The first problem wins, so one configuration never produces two errors.
static_assert(diagnose<int, batches::split, batches::split>() == ConfigProblem::not_a_policy);

}  // namespace
