#pragma once
//! \file
//! Umbrella header: everything in accel. The CUDA specialisations (`accel/cuda/`) are included only when
//! ACCEL_WITH_CUDA is set; the generic headers never include them.

#include <accel/accelerator.hpp>
#include <accel/checkpoint.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/config.hpp>
#include <accel/data/batch_sampler_shard.hpp>
#include <accel/data/dataset.hpp>
#include <accel/state/gradient_state.hpp>
#include <accel/data/loader.hpp>
#include <accel/data/iterable_shard.hpp>
#include <accel/plan/plan.hpp>
#include <accel/data/plan_view.hpp>
#include <accel/data/sampler.hpp>
#include <accel/error.hpp>
#include <accel/model/distributed_module.hpp>
#include <accel/model/prepared_model.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/policy/batches.hpp>
#include <accel/policy/dist.hpp>
#include <accel/policy/loading.hpp>
#include <accel/policy/place.hpp>
#include <accel/policy/rng.hpp>
#include <accel/policy/slots.hpp>
#include <accel/policy/tail.hpp>
#include <accel/state/launch_env.hpp>
#include <accel/state/process_state.hpp>

#if ACCEL_WITH_CUDA
#include <accel/cuda/nccl.hpp>
#include <accel/cuda/placement.hpp>
#include <accel/cuda/rng.hpp>
#endif
