#pragma once
//! \file
//! CUDA specialisation of RNG synchronisation: `rng::cuda` broadcasts rank 0's state of the current GPU's
//! default generator (Accelerate's rng_type "cuda").

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/rng.hpp> needs ACCEL_WITH_CUDA"
#endif

#include <accel/comm/rng.hpp>

#include <ATen/Context.h>
#include <c10/core/Device.h>

namespace accel {

template <>
struct sync_rng<rng::cuda> {
  static void run(comm::Communicator& comm, std::optional<at::Generator>&) {
    // The current GPU's default generator (device index -1: the current device), through ATen's generic entry,
    // as the checkpointer reads it: no CUDA header needed.
    at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA));
    detail::broadcast_generator_state(comm, g);
  }
};

}  // namespace accel
