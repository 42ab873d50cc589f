#pragma once
//! \file
//! Slot `placement`: where batches are put before the loop sees them.

#include <accel/policy/slots.hpp>

//! The `place` policies: device placement of batches.
namespace accel::place {

//! Batches stay where the dataset made them (`device_placement=False`).
struct none {
  using slot = accel::slot::placement;  //!< fills the `place` slot
};
//! Batches are moved to the process's device before they are yielded. The default.
struct device {
  using slot = accel::slot::placement;  //!< fills the `place` slot
};
//! CUDA only: pinned staging buffers and a copy stream, so the copy of batch j+1 overlaps the compute
//! on batch j. Needs ACCEL_WITH_CUDA and a distributed policy that can run on a GPU.
struct async {
  using slot = accel::slot::placement;  //!< fills the `place` slot
};

static_assert(PolicyOf<none, slot::placement> && PolicyOf<device, slot::placement> && PolicyOf<async, slot::placement>);

}  // namespace accel::place
