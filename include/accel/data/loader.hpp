#pragma once
//! \file
//! The data loaders: the user's `DataLoader` (data_loader.hpp) and the prepared loaders `ShardedLoader`,
//! `DispatchedLoader`, `StreamShardedLoader` and `StreamDispatchedLoader` that `prepare_data_loader` makes of it
//! (prepare.hpp; one `PreparedLoader`, prepared_loader.hpp).
//!
//! What goes in data/ and what in pipeline/: data/ (namespace `accel::data`) is the user's vocabulary, what a
//! user names, writes or holds: datasets, collate functions, `DataLoaderOptions`, `PrepareContext`, samplers, the
//! Accelerate-named shards (`BatchSamplerShard`, `IterableShard`), `DataLoader`, `LoaderState`, and the prepared
//! loaders (`PreparedLoader` and its names, `prepare_data_loader`). pipeline/ (namespace `accel::pipeline`) is the
//! machinery a prepared loader runs and no user names: the step sources, the transports, the loader core, the
//! epoch cursor, the workers, placement, the plan view (`planned_batches`, also named in `accel::data`). The
//! loaders of data/ (data_loader.hpp, prepared_loader.hpp, prepare.hpp, this header) sit above the pipeline
//! (tests/static/layers.py); the rest of data/ below it.

#include <accel/data/data_loader.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/prepare.hpp>
