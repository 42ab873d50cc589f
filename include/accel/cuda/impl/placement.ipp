#pragma once
//! \file
//! The definitions of cuda/placement.hpp's stream functions, included at its end: they need the CUDA runtime's headers,
//! which stay out of user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/cuda/placement.hpp>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace accel::cuda {

ACCEL_DECL void on_side_stream(c10::Device device, c10::function_ref<void()> copies) {
  c10::cuda::CUDAGuard guard(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  c10::cuda::CUDAStreamGuard on_side(side);
  copies();
  at::cuda::CUDAEvent landed;
  landed.record(side);
  landed.synchronize();  // the hand-off: the batch is on the device before the loop can see it
}

ACCEL_DECL c10::Stream current_stream(c10::Device device) { return c10::cuda::getCurrentCUDAStream(device.index()); }

}  // namespace accel::cuda
