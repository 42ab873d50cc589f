// Resolution when accel is built without CUDA: the CUDA-only policies are refused.
#undef ACCEL_WITH_CUDA
#define ACCEL_WITH_CUDA 0
#include <accel/config.hpp>

namespace {
using namespace accel;
static_assert(diagnose<dist::nccl>() == ConfigProblem::nccl_without_cuda_build);
static_assert(diagnose<rng::sync<rng::cuda>>() == ConfigProblem::rng_cuda_without_cuda_build);
static_assert(diagnose<place::async>() == ConfigProblem::async_without_cuda_build);
}  // namespace
