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
#include <accel/detail/linkage.hpp>
#include <accel/pipeline/placement.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/FunctionRef.h>

#include <optional>
#include <utility>

namespace accel::cuda {

//! Runs `copies` with a side stream of `device` (one from the pool) as the current stream, then waits until what
//! they queued on it has landed: an event recorded on the side stream, synchronised.
ACCEL_DECL void on_side_stream(c10::Device device, c10::function_ref<void()> copies);
//! The current stream of `device` (the loop's), on which a batch's tensors are recorded as used.
ACCEL_DECL c10::Stream current_stream(c10::Device device);

}  // namespace accel::cuda

namespace accel::pipeline {

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
      std::optional<Batch> out;
      cuda::on_side_stream(device, [&] {
        out.emplace(map_tensors(b, [&](const at::Tensor& t) {
          const at::Tensor staged = t.is_pinned() ? t : t.pin_memory();
          return staged.to(device, /*non_blocking=*/true);
        }));
      });
      return std::move(*out);
    }
  }

  //! On the loop's thread: the tensors are used on its current stream from now on.
  template <class Batch>
  void hand_over(Batch& b) const {
    if constexpr (TensorStructure<Batch>) {
      if (!device.is_cuda()) return;
      const c10::Stream current = cuda::current_stream(device);
      for_each_tensor(b, [&](at::Tensor& t) {
        if (t.is_cuda()) t.record_stream(current);
      });
    }
  }

  c10::Device device;
};

}  // namespace accel::pipeline

#if ACCEL_DEFINITIONS
#include <accel/cuda/impl/placement.ipp>
#endif
