#pragma once
//! \file
//! Slot `distributed`: which engine connects the processes.

#include <accel/policy/slots.hpp>

//! The `dist` policies: the distributed engine.
namespace accel::dist {

//! One process, no communication. Collectives return their input (Accelerate's `DistributedType.NO`).
struct none {
  using slot = accel::slot::distributed;  //!< fills the `dist` slot
};
//! Several processes, CPU tensors, c10d `ProcessGroupGloo` over a `TCPStore` (Accelerate's `MULTI_CPU`).
struct gloo {
  using slot = accel::slot::distributed;  //!< fills the `dist` slot
};
//! Several processes, one GPU each, NCCL on our own streams (Accelerate's `MULTI_GPU`). Needs ACCEL_WITH_CUDA.
struct nccl {
  using slot = accel::slot::distributed;  //!< fills the `dist` slot
};
//! Decided at start-up from the launcher's variables: one process is `none`; several use `nccl` when the
//! process sees a GPU and accel was built with CUDA, `gloo` otherwise. The default.
struct from_env {
  using slot = accel::slot::distributed;  //!< fills the `dist` slot
};

static_assert(PolicyOf<none, slot::distributed> && PolicyOf<gloo, slot::distributed> &&
              PolicyOf<nccl, slot::distributed> && PolicyOf<from_env, slot::distributed>);

}  // namespace accel::dist
