#pragma once
//! \file
//! `LoaderState`: what a prepared loader's checkpoint holds, enough for a fresh process to yield exactly the
//! remaining batches (`state_dict()` / `load_state_dict()`; `Accelerator::save_state` stores one per loader).

#include <cstdint>
#include <tuple>
#include <vector>

namespace accel::data {

struct LoaderState {
  std::int64_t epoch = 0;                      //!< the epoch in progress (or the next one)
  std::int64_t batches = 0;                    //!< batches of that epoch already handed to the loop
  std::vector<std::uint8_t> generator_state;   //!< the sampling generator's state at the start of that epoch
};
inline auto accel_fields(LoaderState& s) { return std::tie(s.epoch, s.batches, s.generator_state); }
inline auto accel_fields(const LoaderState& s) { return std::tie(s.epoch, s.batches, s.generator_state); }

//! Who puts the global generator where a resumed job needs it, when a one-process loader draws its order
//! from it: the loader (rewinding it to the resumed epoch's start) or the caller (`Accelerator::load_state`).
enum class GlobalGenerator { rewound_by_loader, restored_by_caller };

}  // namespace accel::data
