#pragma once
//! \file
//! CUDA specialisation of RNG synchronisation: `rng::cuda` broadcasts rank 0's state of the current GPU's
//! default generator (Accelerate's rng_type "cuda").

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/rng.hpp> needs ACCEL_WITH_CUDA"
#endif

#include <accel/comm/rng.hpp>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>

namespace accel {

template <>
struct sync_rng<rng::cuda> {
  static void run(comm::Communicator& comm, std::optional<at::Generator>&) {
    at::Generator g = at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
    detail::broadcast_generator_state(comm, g);
  }
};

}  // namespace accel
