#pragma once
//! \file
//! Slot `tail`: what happens to the last, incomplete round of batches.

#include <accel/policy/slots.hpp>

//! The `tail` policies: Accelerate's `even_batches`.
namespace accel::tail {

//! Every process yields the same number of full batches; the last round is completed with samples from
//! the start of the epoch, which `gather_for_metrics` drops again. The default (`even_batches=True`).
struct even {
  using slot = accel::slot::tail;  //!< fills the `tail` slot
};
//! Nothing is added: processes may yield different numbers of batches and a short last batch
//! (`even_batches=False`).
struct uneven {
  using slot = accel::slot::tail;  //!< fills the `tail` slot
};

static_assert(PolicyOf<even, slot::tail> && PolicyOf<uneven, slot::tail>);

}  // namespace accel::tail
