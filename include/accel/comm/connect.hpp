#pragma once
//! \file
//! The Gloo engine's constructor, declared apart from the engine itself: `make_gloo_communicator`, which
//! comm/impl/gloo.ipp defines, from a `RendezvousSpec` (state/rendezvous/spec.hpp). Under
//! `ACCEL_SEPARATE_COMPILATION` (detail/linkage.hpp, Note [Separate compilation]) state/engine.hpp includes only
//! this header, and c10d's headers stay in the one translation unit of <accel/src.hpp>.

#include <accel/comm/collective_id.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/state/rendezvous/spec.hpp>

#include <memory>
#include <string>

namespace accel::comm {

class Communicator;

//! Rendezvous at the launcher's address and connect its processes with Gloo (comm/gloo.hpp; comm/impl/gloo.ipp).
ACCEL_DECL std::unique_ptr<Communicator> make_gloo_communicator(const rendezvous::RendezvousSpec& spec,
                                                                const CommOptions& opt);

}  // namespace accel::comm
