#pragma once
//! \file
//! RNG synchronisation (Accelerate's `synchronize_rng_states`) and `set_seed`. Rank 0's generator state is
//! broadcast to every rank. One specialisation of `sync_rng` per kind of generator; `rng::cuda`'s lives in
//! `accel/cuda/rng.hpp`, which this header includes itself in a CUDA build.

#include <accel/comm/communicator.hpp>
#include <accel/detail/cuda_build.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/policy/rng.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>

namespace accel {

//! Synchronises one kind of generator. The primary template is never instantiated for a valid kind.
template <class Kind>
struct sync_rng {
  static_assert(sizeof(Kind) == 0,
                "accel: no RNG synchronisation for this kind; use accel::rng::torch, "
                "accel::rng::generator, or accel::rng::cuda in a CUDA build (ACCEL_WITH_CUDA=1)");
};

namespace detail {
inline void broadcast_generator_state(comm::Communicator& comm, at::Generator& g) {
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    state = g.get_state();
  }
  at::Tensor moving = state.to(comm.device());
  comm.broadcast(moving, 0);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(moving.cpu());
}
}  // namespace detail

// [accelerate:utils/random.py synchronize_rng_state] (rng_type "cpu"/"torch")
//! `rng::torch`: rank 0's default CPU generator state is broadcast (Accelerate's rng_type "cpu" / "torch").
template <>
struct sync_rng<rng::torch> {
  //! Broadcasts rank 0's state of the default CPU generator.
  static void run(comm::Communicator& comm, std::optional<at::Generator>&) {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    detail::broadcast_generator_state(comm, g);
  }
};

// [accelerate:utils/random.py synchronize_rng_state] (rng_type "generator")
//! `rng::generator`: rank 0's state of the loader's sampler generator is broadcast (Accelerate's rng_type "generator").
template <>
struct sync_rng<rng::generator> {
  //! Broadcasts rank 0's state of `g`, when the loader has one.
  static void run(comm::Communicator& comm, std::optional<at::Generator>& g) {
    if (g) detail::broadcast_generator_state(comm, *g);  // a loader without a sampler generator has nothing to sync
  }
};

//! Makes the generators of `Rng` (an `rng::sync<kinds...>` or `rng::none`) equal on every rank.
template <class Rng>
void synchronize_rng_states(comm::Communicator* comm, std::optional<at::Generator> generator = std::nullopt) {
  if (!comm || comm->size() == 1) return;
  [&]<class... Kinds>(rng::sync<Kinds...>*) {
    (sync_rng<Kinds>::run(*comm, generator), ...);
  }(static_cast<std::conditional_t<std::is_same_v<Rng, rng::none>, rng::sync<>, Rng>*>(nullptr));
}

//! Seeds torch's generators (CPU and every GPU). `device_specific` adds the process index, so ranks differ.
inline void set_seed(std::uint64_t seed, int process_index = 0, bool device_specific = false) {
  at::manual_seed(seed + (device_specific ? std::uint64_t(process_index) : 0));
}

}  // namespace accel

#if ACCEL_WITH_CUDA
#include <accel/cuda/rng.hpp>
#endif
