#pragma once
//! \file
//! The definitions behind state/engine.hpp, included at its end: `visible_gpus` and `use_gpu` (the CUDA runtime) and
//! the engines themselves (comm/gloo.hpp, cuda/nccl.hpp: c10d, Gloo, NCCL), whose factories state/engine.hpp calls.
//! Header-only, every translation unit that includes state/engine.hpp compiles them; under ACCEL_SEPARATE_COMPILATION
//! only the one of <accel/src.hpp> does (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/comm/gloo.hpp>
#include <accel/state/engine.hpp>

#if ACCEL_WITH_CUDA
#include <accel/cuda/nccl.hpp>

#include <c10/cuda/CUDAFunctions.h>
#endif

namespace accel {

ACCEL_DECL int visible_gpus() {
#if ACCEL_WITH_CUDA
  return int(c10::cuda::device_count());
#else
  return 0;
#endif
}

ACCEL_DECL void use_gpu([[maybe_unused]] int device) {
#if ACCEL_WITH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
#endif
}

}  // namespace accel
