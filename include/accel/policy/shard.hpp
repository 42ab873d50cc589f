#pragma once
//! \file
//! Slot `sharding`: what data-parallel training splits across the processes instead of replicating (ZeRO).

#include <accel/policy/slots.hpp>

//! The `shard` policies: ZeRO stages.
namespace accel::shard {

//! Every process holds the whole optimizer state (plain DDP). The default.
struct none {
  using slot = accel::slot::sharding;  //!< fills the `shard` slot
};
//! ZeRO stage 1: each process keeps the optimizer state of its 1/N partition of a flat parameter space, steps
//! only that partition, and all-gathers the updated parameters (optim/sharded.hpp). Gradients are still averaged
//! whole, as in DDP. Needs several processes.
struct optimizer {
  using slot = accel::slot::sharding;  //!< fills the `shard` slot
};
//! ZeRO stage 2: stage 1, and each gradient is reduced during backward to the process that owns its partition
//! (model/partition_reducer.hpp), so each process keeps only its partition's gradients after a synchronising
//! backward (the parameters' own gradients are released). Needs several processes.
struct gradients {
  using slot = accel::slot::sharding;  //!< fills the `shard` slot
};

//! Full sharding (FSDP, ZeRO stage 3; Accelerate's FSDP plugin with `FULL_SHARD`): stage 2, and the parameters too.
//! Each process keeps 1/N of every unit's parameters (model/unit_sharder.hpp); a unit's full parameters exist only
//! while its forward or backward runs, gathered on its first use and freed after. Units are chosen by
//! `Options::sharding` (`ShardingOptions`). Needs several processes, and `tail::even` (the default).
struct parameters {
  using slot = accel::slot::sharding;  //!< fills the `shard` slot
};

static_assert(PolicyOf<none, slot::sharding> && PolicyOf<optimizer, slot::sharding> &&
              PolicyOf<gradients, slot::sharding> && PolicyOf<parameters, slot::sharding>);

}  // namespace accel::shard
