#pragma once
//! \file
//! CUDA specialisation of RNG synchronisation: `rng::cuda` broadcasts rank 0's state of the current GPU's
//! default generator (Accelerate's rng_type "cuda").

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/rng.hpp> needs ACCEL_WITH_CUDA"
#endif

#include <accel/comm/rng.hpp>
#include <accel/detail/linkage.hpp>

#include <ATen/core/Generator.h>

#if ACCEL_DEFINITIONS  // the CUDA runtime's headers stay out of user code under ACCEL_SEPARATE_COMPILATION
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace accel {

namespace cuda {
//! The default generator of the current GPU.
ACCEL_DECL at::Generator current_default_generator();
#if ACCEL_DEFINITIONS
ACCEL_DECL at::Generator current_default_generator() {
  return at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
}
#endif
}  // namespace cuda

template <>
struct sync_rng<rng::cuda> {
  static void run(comm::Communicator& comm, std::optional<at::Generator>&) {
    at::Generator g = cuda::current_default_generator();
    detail::broadcast_generator_state(comm, g);
  }
};

}  // namespace accel
