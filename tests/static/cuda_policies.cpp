// Resolution of the CUDA-only policies when accel is built with CUDA (this TU forces ACCEL_WITH_CUDA=1, the
// way a CUDA build of LibTorch does), so it is checked on every machine.
#undef ACCEL_WITH_CUDA
#define ACCEL_WITH_CUDA 1
#include <accel/config.hpp>

namespace {
using namespace accel;
static_assert(diagnose<dist::nccl, place::async, rng::sync<rng::cuda, rng::torch, rng::generator>>() ==
              ConfigProblem::none);
static_assert(diagnose<dist::from_env, place::async>() == ConfigProblem::none);
static_assert(diagnose<dist::none, place::async>() == ConfigProblem::none);  // one process on one GPU
static_assert(diagnose<dist::none, rng::sync<rng::cuda>>() == ConfigProblem::rng_cuda_without_gpu_engine);
using Gpu = CheckedConfig<dist::nccl, place::async, rng::sync<rng::cuda>>;
static_assert(Gpu::async_placement && Gpu::sync_cuda_rng);
}  // namespace
