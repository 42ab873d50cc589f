#pragma once
//! \file
//! Slot `batching`: what the loader's `batch_size` means.

#include <accel/policy/slots.hpp>

//! The `batches` policies: Accelerate's `split_batches`.
namespace accel::batches {

//! `batch_size` is per process: one optimizer step sees `batch_size * num_processes` samples. The default
//! (Accelerate's `split_batches=False`).
struct per_process {
  using slot = accel::slot::batching;  //!< fills the `batches` slot
};
//! `batch_size` is global and is split between the processes: it must be a multiple of `num_processes`
//! (Accelerate's `split_batches=True`).
struct split {
  using slot = accel::slot::batching;  //!< fills the `batches` slot
};

static_assert(PolicyOf<per_process, slot::batching> && PolicyOf<split, slot::batching>);

}  // namespace accel::batches
