#pragma once
//! \file
//! The distributed engine, chosen by the `dist` policy at compile time: one specialisation of `Engine` per tag.
//!
//! | tag              | engine                                                                              |
//! |------------------|-------------------------------------------------------------------------------------|
//! | `dist::none`     | one process, no communicator; the GPU when the build has CUDA and one is visible     |
//! | `dist::gloo`     | c10d `ProcessGroupGloo` over accel's rendezvous (comm/gloo.hpp), CPU tensors          |
//! | `dist::nccl`     | NCCL on accel's own stream (cuda/nccl.hpp), one GPU per process; CUDA builds only     |
//! | `dist::from_env` | one process: `none`; several: `nccl` when the build has CUDA and the process sees a GPU, else
//! `gloo` |
//!
//! There is no registry and no static initialisation: this header includes the NCCL engine itself whenever
//! ACCEL_WITH_CUDA is set (its declaration, cuda/connect.hpp; its definition comes with state/impl/engine.ipp,
//! header-only, or <accel/src.hpp> under ACCEL_SEPARATE_COMPILATION), so
//! every public header gives the same engine for the same policy on the same machine, whatever else a
//! translation unit includes. Naming `Engine<dist::nccl>` in a build without CUDA is
//! one `static_assert` (`Accelerator<dist::nccl>` reports it through its configuration check instead).

#include <accel/comm/communicator.hpp>
#include <accel/comm/connect.hpp>
#include <accel/detail/cuda_build.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/policy/dist.hpp>
#include <accel/state/launch_env.hpp>

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#if ACCEL_WITH_CUDA
#include <accel/cuda/connect.hpp>
#endif

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

namespace accel {

//! Accelerate's `DistributedType`, the subset LibTorch can run.
enum class DistributedType { no, multi_cpu, multi_gpu };

//! How a process joins its job: explicit launch arguments, timeouts, and where the launcher's variables are read.
struct ProcessOptions {
  LaunchOverrides launch;       //!< explicit rank / world size / rendezvous, winning over the environment
  comm::CommOptions comm;       //!< timeouts
  EnvLookup env = process_env;  //!< where the launcher's variables are read (tests pass their own)
};

//! What an engine gives a process: its kind of job, its device and its communicator (null with one process).
struct Connection {
  DistributedType type = DistributedType::no;   //!< no, multi_cpu or multi_gpu
  c10::Device device = c10::Device(c10::kCPU);  //!< the process's device
  std::unique_ptr<comm::Communicator> comm;     //!< null with one process
};

//! GPUs this process sees: the CUDA device count in a build with CUDA, 0 otherwise.
ACCEL_DECL int visible_gpus();  // state/impl/engine.ipp (the CUDA runtime)
//! Makes GPU `device` this process's current device, as Accelerate's `PartialState` calls `torch.cuda.set_device`:
//! what names `kCUDA` without an index (the default CUDA generator that `rng::cuda` synchronises and a checkpoint
//! saves, new tensors, the current stream) is then this process's GPU, not GPU 0 on every rank. A no-op
//! without CUDA.
ACCEL_DECL void use_gpu(int device);  // state/impl/engine.ipp (the CUDA runtime)

namespace detail {
//! Where and as whom this process meets the others: the launcher's address and generation, and the job's id
//! and secret (state/rendezvous/job_identity.hpp and state/rendezvous/store.hpp, Notes [Job keys] and
//! [Authenticated keys]).
inline rendezvous::RendezvousSpec rendezvous_of(const LaunchEnv& env, const EnvLookup& vars) {
  return {.addr = env.master_addr,
          .port = env.master_port,
          .rank = env.rank,
          .size = env.world_size,
          .host_store = !env.agent_store,
          .generation = env.restart_count,
          .job = {.id = rendezvous::job_id_from(vars), .secret = rendezvous::job_secret_from(vars)}};
}
}  // namespace detail

//! The engine of a `dist` tag: `static Connection connect(const LaunchEnv&, const ProcessOptions&)`.
template <class Dist>
struct Engine {
  static_assert(
      !std::is_same_v<Dist, dist::nccl>,
      "accel::dist::nccl needs CUDA, but accel is built without it (ACCEL_WITH_CUDA=0); use accel::dist::gloo "
      "or a LibTorch with CUDA");
  static_assert(std::is_same_v<Dist, dist::nccl>,
                "accel: no engine for this type; use accel::dist::none, gloo, nccl or from_env");
  //! Declared only: an unknown tag stops the build at the assertions above.
  static Connection connect(const LaunchEnv&,
                            const ProcessOptions&);  // declared only: the assertion above is the error
};

//! `dist::none`: one process, no communicator; the GPU when the build has CUDA and one is visible.
template <>
struct Engine<dist::none> {
  //! The engine for the launch environment `env`.
  static Connection connect(const LaunchEnv& env, const ProcessOptions&) {
    detail::require(env.world_size == 1, "accel: dist::none runs one process, but the launcher started " +
                                             std::to_string(env.world_size) +
                                             " (WORLD_SIZE); use dist::from_env or dist::gloo, or launch one process");
    return {DistributedType::no, visible_gpus() > 0 ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU), nullptr};
  }
};

//! `dist::gloo`: c10d's ProcessGroupGloo over accel's rendezvous, on the CPU.
template <>
struct Engine<dist::gloo> {
  //! The engine for the launch environment `env`: the rendezvous, then a c10d Gloo group over it.
  static Connection connect(const LaunchEnv& env, const ProcessOptions& opt) {
    Connection c;
    if (env.world_size == 1) return c;
    share_cores(opt.env, env.local_world_size);
    c.type = DistributedType::multi_cpu;
    c.comm = comm::make_gloo_communicator(detail::rendezvous_of(env, opt.env), opt.comm);
    return c;
  }

  // [accelerate:state.py PartialState.__init__] (MULTI_CPU): without OMP_NUM_THREADS, the processes of a node
  // share its cores instead of each taking all of them.
  //! Without `OMP_NUM_THREADS`, sets the intra-op threads to this node's cores divided by its processes.
  static void share_cores(const EnvLookup& env, int local_processes) {
    if (local_processes <= 1) return;
    if (auto v = env("OMP_NUM_THREADS");
        v && !v->empty() && v->find_first_not_of("0123456789") == std::string::npos && std::stoi(*v) > 0)
      return;
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(std::max(1, cores / local_processes));
  }
};

#if ACCEL_WITH_CUDA
//! `dist::nccl`: NCCL on accel's own stream, one GPU per process (CUDA builds only).
template <>
struct Engine<dist::nccl> {
  //! The engine for the launch environment `env`: the rendezvous, then an NCCL communicator on GPU `local_rank`.
  static Connection connect(const LaunchEnv& env, const ProcessOptions& opt) {
    const int gpus = visible_gpus();
    detail::require(gpus > 0,
                    "accel: dist::nccl, but this process sees no GPU (CUDA_VISIBLE_DEVICES?); use dist::gloo "
                    "or dist::from_env to run on the CPU");
    const int device = env.local_rank % gpus;
    use_gpu(device);
    Connection c{DistributedType::no, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)), nullptr};
    if (env.world_size == 1) return c;
    c.type = DistributedType::multi_gpu;
    c.comm = cuda::make_nccl_communicator(detail::rendezvous_of(env, opt.env), opt.comm, device);
    return c;
  }
};
#endif

//! `dist::from_env`: `dist::none` for one process; for several, NCCL when the build has CUDA and the process sees a
//! GPU, else Gloo.
template <>
struct Engine<dist::from_env> {
  //! The engine for the launch environment `env`, chosen as above.
  static Connection connect(const LaunchEnv& env, const ProcessOptions& opt) {
    if (env.world_size == 1) return Engine<dist::none>::connect(env, opt);
#if ACCEL_WITH_CUDA
    if (visible_gpus() > 0) return Engine<dist::nccl>::connect(env, opt);
#endif
    return Engine<dist::gloo>::connect(env, opt);
  }
};

}  // namespace accel

#if ACCEL_DEFINITIONS
#include <accel/state/impl/engine.ipp>
#endif
