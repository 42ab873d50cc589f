#pragma once
//! \file
//! CUDA specialisation of RNG synchronisation: `rng::cuda` broadcasts rank 0's state of this process's GPU's
//! default generator (Accelerate's rng_type "cuda").

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/rng.hpp> needs ACCEL_WITH_CUDA"
#endif

#include <accel/comm/rng.hpp>

#include <ATen/Context.h>
#include <c10/core/Device.h>

namespace accel {

//! `rng::cuda`: rank 0's default GPU generator state is broadcast to every rank.
template <>
struct sync_rng<rng::cuda> {
  //! Broadcasts rank 0's state of the default generator of this process's GPU.
  static void run(comm::Communicator& comm, std::optional<at::Generator>&) {
    // The default generator of this process's GPU (the communicator's; the engine also makes it the current
    // device, where the checkpointer reads it), through ATen's generic entry: no CUDA header needed.
    const c10::Device device = comm.device().is_cuda() ? comm.device() : c10::Device(c10::kCUDA);
    at::Generator g = at::globalContext().defaultGenerator(device);
    detail::broadcast_generator_state(comm, g);
  }
};

}  // namespace accel
