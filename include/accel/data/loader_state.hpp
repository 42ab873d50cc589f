#pragma once
//! \file
//! `LoaderState`: what a prepared loader's checkpoint holds, enough for a fresh process to yield exactly the
//! remaining batches (`state_dict()` / `load_state_dict()`; `Accelerator::save_state` stores one per loader), with
//! the same number of processes or another one (README, "Resuming at another world size").
//!
//! The position is global: after k steps, the samples a job has consumed in an epoch are a prefix of the epoch's
//! order, whatever the number of processes, so the rest of the epoch can be planned for any number of processes.
//! What one unit of `position` is depends on the loading path:
//!
//! | loader                               | `position` counts                                                    |
//! |--------------------------------------|----------------------------------------------------------------------|
//! | map-style, sharded or dispatched     | samples of the epoch's order (`k * batch_size * N`; `k * batch_size` under
//! `batches::split`) | | a user's batch sampler               | whole batches of the sampler's epoch (`k * N`) | | an
//! iterable dataset (sharded, dispatched) | items of the stream, in stream order (as a map-style loader's samples) |

#include <accel/detail/linkage.hpp>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace accel::data {

//! The loading path a state was saved by (part of its description: a state resumes only on the same path).
enum class LoaderKind : std::int64_t {
  sharded = 0,
  dispatched = 1,
  batch_sampler = 2,
  stream_sharded = 3,
  stream_dispatched = 4
};

//! The path's name in messages.
inline std::string kind_name(std::int64_t kind) {
  switch (kind) {
    case 0:
      return "loading::sharded";
    case 1:
      return "loading::dispatched";
    case 2:
      return "a batch sampler (loading::sharded)";
    case 3:
      return "an iterable dataset with loading::sharded";
    case 4:
      return "an iterable dataset with loading::dispatched";
    default:
      return "an unknown loading path (" + std::to_string(kind) + ")";
  }
}

//! A prepared loader's position (`state_dict()` / `load_state_dict()`): the epoch, the batches handed out, the sampling
//! generator's state and the job's global position in the epoch, with what the loader was (checked on load). Resumable
//! at any number of processes (README, "Resuming at another world size").
struct LoaderState {
  std::int64_t epoch = 0;    //!< the epoch in progress (or the next one)
  std::int64_t batches = 0;  //!< batches (steps, when dispatched) of that epoch this process already handed to the loop
                             //!< (resumed at another size: this size's steps that reach `position`)
  std::vector<std::uint8_t> generator_state;  //!< the sampling generator's state at the start of that epoch
  //! Units of the epoch's order already consumed by the whole job (see the table above); -1: not recorded (a
  //! checkpoint of format 2: then it follows from `batches`, with the same number of processes only).
  std::int64_t position = -1;
  std::int64_t processes = 0;  //!< processes of the job that saved it (0: not recorded)
  //! Processes whose rule drew the epoch's order: `processes`, unless the epoch was itself resumed at another size
  //! (a one-process loader without a sampler generator draws from the global generator, several processes from a
  //! synchronised sampler generator).
  std::int64_t drawn_by = 0;
  // What the loader was: a state resumes only into a loader of the same dataset length, batch size and path.
  std::int64_t samples = -1;    //!< the dataset's length (-1: a stream of unknown length)
  std::int64_t batch_size = 0;  //!< the loader's `batch_size` (global under `batches::split`)
  std::int64_t kind = 0;        //!< `LoaderKind`
  bool split = false;           //!< `batches::split`
};
//! The state's fields, for accel's typed serialisation (core/serialize.hpp).
inline auto accel_fields(LoaderState& s) {
  return std::tie(s.epoch, s.batches, s.generator_state, s.position, s.processes, s.drawn_by, s.samples, s.batch_size,
                  s.kind, s.split);
}
//! The state's fields, read-only.
inline auto accel_fields(const LoaderState& s) {
  return std::tie(s.epoch, s.batches, s.generator_state, s.position, s.processes, s.drawn_by, s.samples, s.batch_size,
                  s.kind, s.split);
}

//! Who puts the global generator where a resumed job needs it, when a one-process loader draws its order
//! from it: the loader (rewinding it to the resumed epoch's start) or the caller (`Accelerator::load_state`).
enum class GlobalGenerator { rewound_by_loader, restored_by_caller };

}  // namespace accel::data
