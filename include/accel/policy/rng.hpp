#pragma once
//! \file
//! Slot `rng`: which random generators are made equal on every process at the start of each epoch, by
//! broadcasting rank 0's state (Accelerate's `rng_types`).

#include <accel/policy/slots.hpp>

#include <concepts>

//! The `rng` policies: the generators synchronised at each epoch (Accelerate's `rng_types`).
namespace accel::rng {

//! The kinds of generator that can be synchronised. They are arguments of `sync<...>`, not policies.
struct torch {
  static constexpr const char* name = "torch";  //!< Accelerate's rng_type name
};                                              //!< the global CPU generator
struct cuda {
  static constexpr const char* name = "cuda";  //!< Accelerate's rng_type name
};                                             //!< the current GPU's generator
struct generator {
  static constexpr const char* name = "generator";  //!< Accelerate's rng_type name
};                                                  //!< the loader's sampler generator

//! A kind of generator `rng::sync` can name.
template <class K>
concept Kind = std::same_as<K, torch> || std::same_as<K, cuda> || std::same_as<K, generator>;

//! Synchronise the listed kinds: `rng::sync<rng::generator>` is the default for sharded loading
//! (Accelerate's `rng_types=["generator"]`).
template <class... Kinds>
struct sync {
  using slot = accel::slot::rng;  //!< fills the `rng` slot
};

//! Synchronise nothing. The default for dispatched loading, where only rank 0 samples.
struct none {
  using slot = accel::slot::rng;  //!< fills the `rng` slot
};

static_assert(PolicyOf<sync<generator>, slot::rng> && PolicyOf<none, slot::rng>);

}  // namespace accel::rng
