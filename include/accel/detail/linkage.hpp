#pragma once
//! \file
//! Header-only (the default) or separate compilation: where accel's non-template code is compiled.
//!
//! Note [Separate compilation]
//! By default accel is header-only: every function is `inline` and every translation unit that includes a header
//! compiles what it uses. A program may instead define `ACCEL_SEPARATE_COMPILATION` for all of its translation
//! units (as Boost.Asio's `BOOST_ASIO_SEPARATE_COMPILATION`) and include `<accel/src.hpp>` in exactly one `.cpp`
//! of its own (CMake: `accel_add_separate_library(name)` makes a library that does both). Then the headers give
//! only declarations of the few functions whose bodies need a heavy header, and only that one file compiles them
//! and parses those headers (benchmarks/README.md, "Separate compilation", has the figures):
//!
//! - `comm::make_gloo_communicator` (declared in comm/connect.hpp; comm/impl/gloo.ipp): c10d's ProcessGroupGloo,
//!   TCPStore and Gloo (comm/gloo.hpp, state/rendezvous/rendezvous.hpp);
//! - `cuda::make_nccl_communicator` (cuda/connect.hpp; cuda/impl/nccl.ipp): NCCL and the CUDA runtime (cuda/nccl.hpp);
//! - `visible_gpus`, `use_gpu` (state/engine.hpp; state/impl/engine.ipp): the CUDA runtime; that file also includes
//!   both engines' headers, whose factories state/engine.hpp calls;
//! - `cuda::on_side_stream`, `cuda::current_stream` (cuda/placement.hpp; cuda/impl/placement.ipp): the CUDA
//!   runtime's streams, events and guards;
//! - `DistributedModule::ready` (model/distributed_module.hpp; model/impl/distributed_module.ipp): the autograd
//!   engine (its callback queue);
//! - activation checkpointing's `detail::save_call_state`, `detail::run_capturing` and the node's backward
//!   (model/activation_checkpoint.hpp; model/impl/activation_checkpoint.ipp): the dispatcher's RecordFunction, the
//!   autocast state and the autograd engine's `grad`;
//! - `tracking::Trackers`' constructor (tracking/trackers.hpp; tracking/impl/trackers.ipp): the writers
//!   (tracking/jsonl.hpp, csv.hpp, tensorboard.hpp);
//! - the JSON function templates (Note [JSON at the call site]): `read_header` (checkpoint/safetensors_format.hpp;
//!   checkpoint/impl/safetensors_format.ipp), `read_safetensors`, `read_safetensors_metadata`, `write_safetensors`
//!   (safetensors_file.hpp; impl/safetensors_file.ipp), `save_model`, `load_model`, `save_safetensors_sharded`,
//!   `load_safetensors_sharded` (safetensors.hpp; impl/safetensors.ipp): nlohmann-json;
//! - and, for their cost alone (no heavy header, but g++'s work in every translation unit: 72 MB of its 2,000,
//!   measured one header at a time; benchmarks/README.md, "Separate compilation"): `Checkpointer::save`, `load`
//!   (checkpoint/impl/checkpointer.ipp), `RandomSampler::next_epoch`, `settle` (data/impl/sampler.ipp, std::async),
//!   `parse_size`, `unique_storages`, `model_state`, `plan_shards` (checkpoint/impl/safetensors.ipp), `check_pickle`
//!   (checkpoint/impl/pickle.ipp), `check_zip`, `check_layout`, `check_module` (checkpoint/impl/archive.ipp),
//!   `read_meta`, `parse_process_record`, `read_process_record` (checkpoint/impl/format.ipp), ShardedOptimizer's
//!   members (optim/impl/sharded.ipp) and PartitionReducer's (model/impl/partition_reducer.ipp).
//!
//! Everything else is defined in its header in both modes, in its class or as an `inline` function (the
//! Communicator's checks, GradScaler, the schedulers' factories, the launch environment, the optimizer state check,
//! the transport's receive, the RNG broadcast: about 2 MB each, 18 MB in all), so that its signature is written
//! once. Templates over the user's types (the `Accelerator`, the loaders, the wrappers) stay in the headers too.
//! Behaviour is the same in both modes.
//!
//! The shape is Boost.Asio's: such a function is declared `ACCEL_DECL` in its header (a member: in its class), and
//! defined, `ACCEL_DECL` again, in an `impl/*.ipp` file beside the header, which holds the heavy includes and which
//! the header includes by one line at its end, its only use of `ACCEL_DEFINITIONS`:
//!
//! \code
//! // state/engine.hpp
//! ACCEL_DECL int visible_gpus();
//! ...
//! #if ACCEL_DEFINITIONS                    // header-only, or the one translation unit of <accel/src.hpp>
//! #include <accel/state/impl/engine.ipp>   // ACCEL_DECL int visible_gpus() { ... }
//! #endif
//! \endcode
//!
//! An `.ipp` file is included by its header alone, never by name elsewhere. A member defined in an `.ipp` keeps
//! `ACCEL_DECL` on its declaration in the class (header-only, it is then inline from its first declaration: a
//! virtual function declared without `inline` and defined `inline` out of class would be the key function that
//! emits the class's vtable and every virtual function in each translation unit). A JSON function template (Note
//! [JSON at the call site]) is declared in its header, defined in its `.ipp`, and instantiated explicitly by
//! `<accel/src.hpp>`. The mode is the whole program's: a translation unit compiled header-only beside it breaks the
//! one-definition rule, and a program without `<accel/src.hpp>` does not link (those functions are undefined).
//! tests/static/layers.py checks the shape: an `ACCEL_DECL` function is defined in an `.ipp` only, and an `.ipp`
//! belongs to its folder's layer.

#if defined(ACCEL_SOURCE) && !defined(ACCEL_SEPARATE_COMPILATION)
#error \
    "accel: <accel/src.hpp> compiles accel's code for ACCEL_SEPARATE_COMPILATION; define ACCEL_SEPARATE_COMPILATION for every translation unit of the program (CMake: accel_add_separate_library), or do not include <accel/src.hpp> (header-only)"
#endif

#if !defined(ACCEL_SEPARATE_COMPILATION)
//! Marks a function whose body is in an `impl/*.ipp` file: `inline` header-only, nothing under
//! `ACCEL_SEPARATE_COMPILATION` (Note [Separate compilation]).
#define ACCEL_DECL inline
//! 1 where the `impl/*.ipp` bodies are compiled (header-only, or the one translation unit of `<accel/src.hpp>`), else
//! 0.
#define ACCEL_DEFINITIONS 1
#elif defined(ACCEL_SOURCE)
#define ACCEL_DECL
#define ACCEL_DEFINITIONS 1
#else
#define ACCEL_DECL
#define ACCEL_DEFINITIONS 0
#endif
