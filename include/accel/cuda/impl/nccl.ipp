#pragma once
//! \file
//! The definition of `make_nccl_communicator` (declared in cuda/connect.hpp), included by cuda/nccl.hpp: header-only,
//! in every translation unit that includes that header; under ACCEL_SEPARATE_COMPILATION, in the one of <accel/src.hpp>
//! (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/cuda/nccl.hpp>

#include <memory>

namespace accel::cuda {

ACCEL_DECL std::unique_ptr<comm::Communicator> make_nccl_communicator(const rendezvous::RendezvousSpec& spec,
                                                                      const comm::CommOptions& opt, int device) {
  auto rdzv = std::make_unique<rendezvous::Rendezvous>(spec, opt);
  return std::make_unique<NcclCommunicator>(std::move(rdzv), spec, opt, device);
}

}  // namespace accel::cuda
