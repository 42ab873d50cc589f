#pragma once
//! \file
//! What an engine needs to connect a job, declared apart from the engines themselves: `RendezvousSpec` (where
//! and as whom this process meets the others) and `make_gloo_communicator`, which comm/impl/gloo.ipp defines. Under
//! `ACCEL_SEPARATE_COMPILATION` (detail/linkage.hpp, Note [Separate compilation]) state/engine.hpp includes only
//! this header, and c10d's headers stay in the one translation unit of <accel/src.hpp>.

#include <accel/comm/collective_id.hpp>
#include <accel/comm/job_identity.hpp>
#include <accel/detail/linkage.hpp>

#include <memory>
#include <string>

namespace accel::comm {

class Communicator;

//! Where the processes of a job meet: the store's address (rank 0 hosts it unless `host_store` is false), this
//! process's rank and the number of processes.
struct RendezvousSpec {
  std::string addr = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int size = 1;
  bool host_store = true;  //!< rank 0 starts the store (false: the launcher, accel-launch or torchrun's agent, hosts it)
  //! The restart generation (torchrun's and accel-launch's `TORCHELASTIC_RESTART_COUNT`): every key this job
  //! writes is scoped by it, so that a stale key of an earlier attempt can never satisfy the arrival check, the
  //! Gloo rendezvous or the NCCL id exchange of a restarted one.
  int generation = 0;
  //! The job's id and secret (comm/job_identity.hpp and comm/store.hpp, Notes [Job keys] and [Authenticated keys]).
  JobIdentity job;
};

//! Rendezvous at the launcher's address and connect its processes with Gloo (comm/gloo.hpp; comm/impl/gloo.ipp).
ACCEL_DECL std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousSpec& spec, const CommOptions& opt);

}  // namespace accel::comm
