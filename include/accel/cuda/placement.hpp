#pragma once
//! \file
//! CUDA specialisation of placement: `place::async`. The loader's worker threads stage each batch in pinned
//! memory and copy it on a side stream (one per device from the pool); an event guards the hand-off, and the
//! loop's thread records its own stream on the tensors so the caching allocator never reuses them early. With
//! `workers >= 1` and `prefetch >= 1` the copy of batch j+1 overlaps the compute on batch j. On a CPU device
//! there is nothing to copy and batches pass through.

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/placement.hpp> needs ACCEL_WITH_CUDA"
#endif

#include <accel/core/structure.hpp>
#include <accel/data/placement.hpp>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace accel::data {

template <>
struct Placement<place::async> {
  explicit Placement(c10::Device d, bool = true) : device(d) {}  // always pins

  //! On a worker thread: pinned staging, non-blocking copy on a side stream, wait for it to land.
  template <class Batch>
  Batch operator()(Batch b) const {
    if constexpr (!TensorStructure<Batch>) {
      return b;
    } else {
      if (!device.is_cuda()) return b;
      c10::cuda::CUDAGuard guard(device.index());
      const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
      c10::cuda::CUDAStreamGuard on_side(side);
      Batch out = map_tensors(b, [&](const at::Tensor& t) {
        const at::Tensor staged = t.is_pinned() ? t : t.pin_memory();
        return staged.to(device, /*non_blocking=*/true);
      });
      at::cuda::CUDAEvent landed;
      landed.record(side);
      landed.synchronize();  // the hand-off: the batch is on the device before the loop can see it
      return out;
    }
  }

  //! On the loop's thread: the tensors are used on its current stream from now on.
  template <class Batch>
  void hand_over(Batch& b) const {
    if constexpr (TensorStructure<Batch>) {
      if (!device.is_cuda()) return;
      const auto current = c10::cuda::getCurrentCUDAStream(device.index());
      for_each_tensor(b, [&](at::Tensor& t) {
        if (t.is_cuda()) t.record_stream(current);
      });
    }
  }

  c10::Device device;
};

}  // namespace accel::data
