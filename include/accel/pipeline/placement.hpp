#pragma once
//! \file
//! Placement: where a batch is put before the loop sees it, one specialisation per `place` policy.
//! `place::async` (pinned staging, a copy stream, events) lives in `accel/cuda/placement.hpp`, which this header
//! includes itself in a CUDA build.

#include <accel/core/structure.hpp>
#include <accel/detail/cuda_build.hpp>
#include <accel/policy/place.hpp>

#include <c10/core/Device.h>

namespace accel::pipeline {

template <class Place>
struct Placement {
  static_assert(sizeof(Place) == 0,
                "accel: no placement for this policy; place::async needs a CUDA build "
                "(ACCEL_WITH_CUDA=1)");
};

//! Every placement: `operator()(batch)` runs where the batch is prepared (a worker thread, with workers),
//! `hand_over(batch)` on the loop's thread when the loop receives it.
template <>
struct Placement<place::none> {
  explicit Placement(c10::Device, bool = false) {}
  template <class Batch>
  Batch operator()(Batch b) const {
    return b;
  }
  template <class Batch>
  void hand_over(Batch&) const {}
};

// [accelerate:utils/operations.py send_to_device]
template <>
struct Placement<place::device> {
  explicit Placement(c10::Device d, bool pin = false) : device(d), pin_memory(pin) {}
  template <class Batch>
  Batch operator()(Batch b) const {
    if constexpr (TensorStructure<Batch>) {
      if (device.is_cpu()) return b;
      return map_tensors(b, [&](const at::Tensor& t) {
        return (pin_memory && t.is_cpu() && !t.is_pinned() ? t.pin_memory() : t).to(device, /*non_blocking=*/false);
      });
    } else {
      return b;  // not tensors: nothing to move
    }
  }
  template <class Batch>
  void hand_over(Batch&) const {}
  c10::Device device;
  bool pin_memory = false;
};

}  // namespace accel::pipeline

#if ACCEL_WITH_CUDA
#include <accel/cuda/placement.hpp>
#endif
