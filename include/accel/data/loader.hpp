#pragma once
//! \file
//! The data loaders: the user's `DataLoader` (data_loader.hpp) and the prepared loaders `ShardedLoader`,
//! `DispatchedLoader`, `StreamShardedLoader` and `StreamDispatchedLoader` that `prepare_data_loader` makes of it
//! (prepare.hpp; one pipeline, prepared_loader.hpp).

#include <accel/data/data_loader.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/prepare.hpp>
