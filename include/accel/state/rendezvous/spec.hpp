#pragma once
//! \file
//! `RendezvousSpec`: where and as whom a process meets the others of its job. A light header (no c10d): the
//! engines' declarations (comm/connect.hpp, cuda/connect.hpp) and state/engine.hpp take it without the store.

#include <accel/state/rendezvous/job_identity.hpp>

#include <string>

//! Where a job meets: its store (scoped by the job id, its values sealed with the job secret), where it listens, the
//! arrival check and the heartbeat; `accel-launch` uses it too.
namespace accel::rendezvous {

//! Where the processes of a job meet: the store's address (rank 0 hosts it unless `host_store` is false), this
//! process's rank and the number of processes.
struct RendezvousSpec {
  std::string addr = "127.0.0.1";  //!< the store's address
  int port = 29500;                //!< the store's port
  int rank = 0;                    //!< this process's rank
  int size = 1;                    //!< the number of processes
  bool host_store =
      true;  //!< rank 0 starts the store (false: the launcher, accel-launch or torchrun's agent, hosts it)
  //! The restart generation (torchrun's and accel-launch's `TORCHELASTIC_RESTART_COUNT`): every key this job
  //! writes is scoped by it, so that a stale key of an earlier attempt can never satisfy the arrival check, the
  //! Gloo rendezvous or the NCCL id exchange of a restarted one.
  int generation = 0;
  //! The job's id and secret (job_identity.hpp and store.hpp, Notes [Job keys] and [Authenticated keys]).
  JobIdentity job;
};

}  // namespace accel::rendezvous
