#pragma once
//! \file
//! `PrepareContext`: where a prepared loader runs (Accelerate's `prepare_data_loader(num_processes=,
//! process_index=, device=)`), what `prepare_data_loader` takes besides the user's loader.

#include <accel/comm/communicator.hpp>

#include <c10/core/Device.h>

namespace accel::data {

//! Where a prepared loader runs: its rank among `num_processes`, the communicator (nullptr: one process, or
//! ranks simulated in one process as Accelerate's `prepare_data_loader(num_processes=, process_index=)`), and
//! the device batches go to.
struct PrepareContext {
  int num_processes = 1;                        //!< processes of the job
  int process_index = 0;                        //!< this process's rank
  comm::Communicator* comm = nullptr;           //!< null: one process, or ranks simulated
  c10::Device device = c10::Device(c10::kCPU);  //!< where batches go
  //! The context of a process state (`ProcessState`, or anything with its four accessors).
  template <class State>
  static PrepareContext of(const State& s) {
    return {s.num_processes(), s.process_index(), s.comm(), s.device()};
  }
};

}  // namespace accel::data
