#pragma once
//! \file
//! `DataLoaderOptions`: the user's loader settings (PyTorch's DataLoader arguments, plus the seedable sampler of
//! Accelerate), the run-time half of how a loader batches its data.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace accel::data {

//! The user's loader settings (PyTorch's DataLoader arguments, plus the seedable sampler of Accelerate).
struct DataLoaderOptions {
  std::int64_t batch_size = 1;  //!< samples per batch (per process; global under `batches::split`)
  bool shuffle = false;         //!< a new random order every epoch
  bool drop_last = false;       //!< drop the last, incomplete batch
  int workers = 0;              //!< threads preparing batches (0: on the loop's thread); every loading path uses them
  int prefetch = 2;             //!< batches prepared ahead, per worker
  bool seedable = false;        //!< Accelerate's use_seedable_sampler: epoch e is seeded with seed + e
  std::optional<std::uint64_t> data_seed;  //!< the seedable sampler's seed (unset: the global generator's)
  //! PyTorch's `generator=`: the shuffling generator's seed. Unset: drawn from the global generator when the
  //! loader is prepared (Accelerate's rule). Either way it is synchronised across ranks at every epoch.
  std::optional<std::uint64_t> seed;
  //! Stage batches in pinned (page-locked) memory before they are copied to a GPU (`place::device`), so the copy
  //! can run without an extra staging copy. No effect for CPU runs; `place::async` always pins.
  bool pin_memory = false;
  //! A sampler of the user's: the order of epoch e (indices into the dataset, any length); replaces `shuffle`.
  std::function<std::vector<std::int64_t>(std::int64_t epoch)> sampler;
  //! A batch sampler of the user's: the batches of epoch e, of any sizes (bucketing by length, max-tokens...);
  //! replaces `batch_size`, `shuffle` and `sampler`. Sharded as Accelerate's BatchSamplerShard does (whole
  //! batches per process; `drop_last` drops an incomplete round). Needs `batches::per_process`.
  std::function<std::vector<std::vector<std::int64_t>>(std::int64_t epoch)> batch_sampler;
};

}  // namespace accel::data
