#pragma once
//! \file
//! Slot `loading`: who reads the data.

#include <accel/policy/slots.hpp>

//! The `loading` policies: Accelerate's `dispatch_batches`.
namespace accel::loading {

//! Every process reads only its own shard of every batch. The default (`DataLoaderShard`).
struct sharded {
  using slot = accel::slot::loading;  //!< fills the `loading` slot
};
//! Rank 0 reads and collates the global batch; every rank receives only its slice
//! (`dispatch_batches=True`, `DataLoaderDispatcher`).
struct dispatched {
  using slot = accel::slot::loading;  //!< fills the `loading` slot
};

static_assert(PolicyOf<sharded, slot::loading> && PolicyOf<dispatched, slot::loading>);

}  // namespace accel::loading
