#pragma once
//! \file
//! The seven slots of an accel configuration, and what makes a type a policy.
//!
//! A *policy* is an empty tag type with a nested `slot` type naming the one slot it fills. An
//! `Accelerator<Policies...>` takes at most one policy per slot, in any order; an empty slot takes its
//! default (see `config.hpp`).
//!
//! | slot          | tags                                   | Accelerate equivalent                           |
//! |---------------|----------------------------------------|-------------------------------------------------|
//! | `distributed` | `dist::none, gloo, nccl, from_env`     | `DistributedType` (NO / MULTI_CPU / MULTI_GPU)  |
//! | `batching`    | `batches::per_process, split`          | `DataLoaderConfiguration.split_batches`         |
//! | `tail`        | `tail::even, uneven`                   | `DataLoaderConfiguration.even_batches`          |
//! | `loading`     | `loading::sharded, dispatched`         | `DataLoaderConfiguration.dispatch_batches`      |
//! | `rng`         | `rng::sync<kinds...>, rng::none`       | `Accelerator(rng_types=[...])`                  |
//! | `placement`   | `place::none, device, async`           | `device_placement` (+ `non_blocking`)           |
//! | `sharding`    | `shard::none, optimizer, gradients`    | DeepSpeed's ZeRO stage (0, 1, 2)                |

#include <concepts>
#include <string_view>
#include <type_traits>

//! The seven slots of a configuration (each policy tag names one).
namespace accel::slot {

//! The `dist` slot: the distributed engine.
struct distributed {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "distributed";
};
//! The `batches` slot: `split_batches`.
struct batching {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "batching";
};
//! The `tail` slot: `even_batches`.
struct tail {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "tail";
};
//! The `loading` slot: `dispatch_batches`.
struct loading {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "loading";
};
//! The `rng` slot: which generators are synchronised at each epoch.
struct rng {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "rng";
};
//! The `place` slot: device placement of batches.
struct placement {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "placement";
};
//! The `shard` slot: ZeRO stage (optimizer state, gradients).
struct sharding {
  //! The slot's name in diagnostics.
  static constexpr std::string_view name = "sharding";
};

}  // namespace accel::slot

namespace accel {

//! The slot a type fills, or `void` when the type is not a policy.
template <class T>
struct slot_of {
  using type = void;  //!< not a policy: no slot
};
//! A policy's slot: its nested `slot` type.
template <class T>
requires requires { typename T::slot; }
struct slot_of<T> {
  using type = typename T::slot;  //!< the policy's slot
};
//! The slot of `T` (`void` when `T` is not a policy).
template <class T>
using slot_of_t = typename slot_of<T>::type;

//! A type is a policy when its `slot` is one of the seven slots above.
template <class T>
concept Policy = std::is_empty_v<T> &&
    (std::same_as<slot_of_t<T>, slot::distributed> || std::same_as<slot_of_t<T>, slot::batching> ||
     std::same_as<slot_of_t<T>, slot::tail> || std::same_as<slot_of_t<T>, slot::loading> ||
     std::same_as<slot_of_t<T>, slot::rng> || std::same_as<slot_of_t<T>, slot::placement> ||
     std::same_as<slot_of_t<T>, slot::sharding>);

//! A policy of one given slot: `PolicyOf<dist::gloo, slot::distributed>`.
template <class T, class Slot>
concept PolicyOf = Policy<T> && std::same_as<slot_of_t<T>, Slot>;

}  // namespace accel
