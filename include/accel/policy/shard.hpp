#pragma once
//! \file
//! Slot `sharding`: what data-parallel training splits across the processes instead of replicating (ZeRO).

#include <accel/policy/slots.hpp>

namespace accel::shard {

//! Every process holds the whole optimizer state (plain DDP). The default.
struct none { using slot = accel::slot::sharding; };
//! ZeRO stage 1: each process keeps the optimizer state of its 1/N partition of a flat parameter space, steps
//! only that partition, and all-gathers the updated parameters (optim/sharded.hpp). Gradients are still averaged
//! whole, as in DDP. Needs several processes.
struct optimizer { using slot = accel::slot::sharding; };

static_assert(PolicyOf<none, slot::sharding> && PolicyOf<optimizer, slot::sharding>);

}  // namespace accel::shard
