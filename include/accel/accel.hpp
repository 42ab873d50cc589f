#pragma once
//! \file
//! Umbrella header: everything in accel, layer by layer (include/accel/README.md, "Layers"). The CUDA
//! specialisations (`cuda/`) come with the generic headers that need them whenever ACCEL_WITH_CUDA is set. Under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp) the implementation headers are left to <accel/src.hpp>: the
//! engines (comm/gloo.hpp, cuda/nccl.hpp) and the trackers' writers (tracking/csv.hpp, jsonl.hpp, tensorboard.hpp);
//! include one by name to use it directly.

#include <accel/config.hpp>
#include <accel/error.hpp>
#include <accel/policy/batches.hpp>
#include <accel/policy/dist.hpp>
#include <accel/policy/loading.hpp>
#include <accel/policy/place.hpp>
#include <accel/policy/rng.hpp>
#include <accel/policy/slots.hpp>
#include <accel/policy/tail.hpp>

#include <accel/core/generator_state.hpp>
#include <accel/core/serialize.hpp>
#include <accel/core/structure.hpp>

#include <accel/tracking/tracker.hpp>
#include <accel/tracking/trackers.hpp>

#include <accel/plan/plan.hpp>

#include <accel/comm/collectives.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/rng.hpp>

#include <accel/state/engine.hpp>
#include <accel/state/gradient_state.hpp>
#include <accel/state/launch_env.hpp>
#include <accel/state/process_state.hpp>

#include <accel/data/batch_sampler_shard.hpp>
#include <accel/data/data_loader.hpp>
#include <accel/data/dataset.hpp>
#include <accel/data/iterable_shard.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/prepare.hpp>
#include <accel/data/sampler.hpp>

#include <accel/pipeline/plan_view.hpp>

#include <accel/model/activation_checkpoint.hpp>
#include <accel/model/autocast.hpp>
#include <accel/model/distributed_module.hpp>
#include <accel/model/prepared_model.hpp>

#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/optim/schedulers.hpp>

#include <accel/checkpoint/checkpointer.hpp>
#include <accel/checkpoint/format.hpp>
#include <accel/checkpoint/safetensors.hpp>

#include <accel/accelerator.hpp>
