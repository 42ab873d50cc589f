#pragma once
//! \file
//! The NCCL engine's factory, declared apart from the engine (cuda/impl/nccl.ipp defines it), as comm/connect.hpp
//! declares Gloo's: under `ACCEL_SEPARATE_COMPILATION` state/engine.hpp includes only this header.

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/connect.hpp> needs ACCEL_WITH_CUDA (a CUDA build of LibTorch and the CUDA toolkit)"
#endif

#include <accel/comm/connect.hpp>
#include <accel/detail/linkage.hpp>

#include <memory>

namespace accel::cuda {

//! Connects the job's processes with NCCL, this one on GPU `device`.
ACCEL_DECL std::unique_ptr<comm::Communicator> make_nccl_communicator(const rendezvous::RendezvousSpec& spec,
                                                                      const comm::CommOptions& opt, int device);

}  // namespace accel::cuda
