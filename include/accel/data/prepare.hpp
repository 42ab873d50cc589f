#pragma once
//! \file
//! `prepare_data_loader<Config>(loader, state)`: the user's `DataLoader` made into the prepared loader of a
//! configuration, statically typed, and the names of the prepared loaders.
//!
//! | loader                    | dataset   | `loading`    | step source                              | transport |
//! |---------------------------|-----------|--------------|------------------------------------------|---------------------|
//! | `ShardedLoader`           | map-style | `sharded`    | closed-form plan, or the user's batch sampler |
//! `LocalTransport` | | `DispatchedLoader`        | map-style | `dispatched` | closed-form plan (rank 0 fetches) |
//! `DispatchTransport` | | `StreamShardedLoader`     | iterable  | `sharded`    | `IterableShard` of the stream |
//! `LocalTransport`    | | `StreamDispatchedLoader`  | iterable  | `dispatched` | rank 0 reads the stream |
//! `DispatchTransport` |
//!
//! \code
//! accel::data::DataLoader loader(accel::data::TensorDataset(x, y), {.batch_size = 64, .shuffle = true, .workers = 2});
//! accel::ProcessState state;
//! auto sharded = accel::data::prepare_data_loader<Acc::config>(loader, state);   // ShardedLoader or DispatchedLoader
//! for (int epoch = 0; epoch < 3; ++epoch) {
//!   sharded.set_epoch(epoch);
//!   for (const auto& batch : sharded) ...;             // batch.data, batch.target on state.device()
//! }
//! auto checkpoint = sharded.state_dict();              // resume later with load_state_dict(checkpoint)
//! \endcode

#include <accel/config.hpp>
#include <accel/data/data_loader.hpp>
#include <accel/data/prepare_context.hpp>
#include <accel/data/prepared_loader.hpp>
#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/plan_view.hpp>
#include <accel/pipeline/planned_source.hpp>
#include <accel/pipeline/sharded_source.hpp>
#include <accel/pipeline/stream_source.hpp>
#include <accel/pipeline/transport.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace accel::data {

// The pipeline's names a user writes as data's (they were declared here before the pipeline had its folder).
using pipeline::NoSlice;
using pipeline::planned_batches;
using pipeline::PlannedBatch;
using pipeline::PlannedBatches;

// [accelerate:data_loader.py DataLoaderShard]
//! Every process reads only its own batches (from the plan, or from its shard of the user's batch sampler),
//! places them, and publishes `end_of_dataloader` and the padding layout to `GradientState`.
template <class Dataset, class Collate, class Config>
using ShardedLoader = PreparedLoader<pipeline::ShardedSource<Dataset, Collate, Config, pipeline::LocalTransport>,
                                     pipeline::LocalTransport>;

// [accelerate:data_loader.py DataLoaderDispatcher]
//! Rank 0 reads and collates every global batch; every rank receives only its own slice (a scatter: each
//! rank gets about 1/N of the bytes a broadcast of the whole batch would send). The batch's structure must be
//! fixed (tensors, `torch::data::Example`, tuples, structs with `accel_fields`) unless a slice function is given;
//! shapes and dtypes travel as typed metadata; slice sizes come from the plan, which every rank computes alone.
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
using DispatchedLoader =
    PreparedLoader<pipeline::PlannedSource<Dataset, Collate, Config, pipeline::DispatchTransport<Slice>>,
                   pipeline::DispatchTransport<Slice>>;

// [accelerate:data_loader.py DataLoaderShard over IterableDatasetShard]
//! An iterable dataset, sharded (pipeline/stream_source.hpp).
template <class Dataset, class Collate, class Config>
using StreamShardedLoader =
    PreparedLoader<pipeline::StreamShardSource<Dataset, Collate, Config, pipeline::LocalTransport>,
                   pipeline::LocalTransport>;

// [accelerate:data_loader.py DataLoaderDispatcher over an iterable dataset]
//! An iterable dataset, dispatched from rank 0 (pipeline/stream_source.hpp).
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
using StreamDispatchedLoader =
    PreparedLoader<pipeline::StreamDispatchSource<Dataset, Collate, Config, pipeline::DispatchTransport<Slice>>,
                   pipeline::DispatchTransport<Slice>>;

namespace detail {
// `prepare_data_loader`; `publish`: whether the loader registers with GradientState (prepared loaders do; the
// user's own one-process loader does not).
template <class Config, class Dataset, class Collate, class Slice>
auto prepare(const DataLoader<Dataset, Collate>& loader, const PrepareContext& ctx, Slice slice, bool publish) {
  static_assert(Config::dispatch || std::is_same_v<Slice, NoSlice>,
                "accel: a slice function only applies to loading::dispatched (rank 0 cuts the global batch with it)");
  // The loading policy picks the transport; from here on the transport alone says which ranks read.
  using Transport = std::conditional_t<Config::dispatch, pipeline::DispatchTransport<Slice>, pipeline::LocalTransport>;
  using Core = pipeline::detail::LoaderCore<Dataset, Collate, Config, Transport>;
  const auto& o = loader.options();
  auto core = std::make_shared<Core>();
  core->dataset = loader.dataset();
  core->collate = loader.collate();
  core->options = o;
  core->ctx = ctx;
  core->publish = publish;
  if constexpr (IterableDataset<Dataset>) {
    accel::detail::require(!o.shuffle,
                           "accel: an iterable dataset cannot be shuffled by the loader; shuffle the stream itself");
    accel::detail::require(!o.sampler && !o.batch_sampler,
                           "accel: an iterable dataset has no indices to sample; drop sampler/batch_sampler");
  }
  accel::detail::require(!(o.sampler && o.batch_sampler), "accel: give a sampler or a batch_sampler, not both");
  accel::detail::require(!(o.shuffle && (o.sampler || o.batch_sampler)),
                         "accel: shuffle=true with a sampler of your own: shuffle inside the sampler, or drop it");
  if (o.batch_sampler) {
    accel::detail::require(!Config::split_batches,
                           "accel: batches::split needs a fixed batch size; a batch sampler's batches "
                           "vary: use batches::per_process");
    accel::detail::require(!Transport::single_reader,
                           "accel: a batch sampler with loading::dispatched is not available; use loading::sharded");
  }
  // The one validation of the sharding rules, strict on every path (Accelerate's prepare_data_loader refuses
  // split_batches with a batch size that is not a round multiple of the processes, even where its classes would not).
  plan::validate(core->spec(ctx.process_index), plan::Loading::sharded, /*varying_ok=*/bool(o.batch_sampler));
  if constexpr (MapDataset<Dataset>) {
    // With one reader it alone samples: one process's view of the sampler (no synchronisation). A stream has no
    // indices to shuffle (refused above), nor, in general, a size.
    if (o.shuffle)
      core->orders = std::make_shared<ShuffledOrders>(
          loader.dataset()->size(), Transport::single_reader ? 1 : ctx.num_processes,
          o.seedable ? Shuffle::seedable : Shuffle::synchronized, o.data_seed, RandomSamplerOptions{}, o.seed);
  }
  if constexpr (IterableDataset<Dataset> && Transport::single_reader)
    return StreamDispatchedLoader<Dataset, Collate, Config, Slice>(core, Transport{std::move(slice)});
  else if constexpr (IterableDataset<Dataset>)
    return StreamShardedLoader<Dataset, Collate, Config>(core);
  else if constexpr (Transport::single_reader)
    return DispatchedLoader<Dataset, Collate, Config, Slice>(core, Transport{std::move(slice)});
  else
    return ShardedLoader<Dataset, Collate, Config>(core);
}
}  // namespace detail

// [accelerate:data_loader.py prepare_data_loader]
//! The prepared loader for `Config` (`loading::sharded` -> ShardedLoader, `loading::dispatched` ->
//! DispatchedLoader; the stream variants for iterable datasets), statically typed. A shuffled loader's sampler is
//! drawn as Accelerate draws it: a generator seeded from the global one and synchronised at every epoch, or the
//! seedable sampler.
template <class Config, class Dataset, class Collate, class Slice = NoSlice>
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const PrepareContext& ctx, Slice slice = {}) {
  return detail::prepare<Config>(loader, ctx, std::move(slice), /*publish=*/true);
}

//! `prepare_data_loader` for this process (`ProcessState`, or anything with its accessors).
template <class Config, class Dataset, class Collate, class State, class Slice = NoSlice>
requires requires(const State& s) {
  s.comm();
  s.device();
}
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const State& state, Slice slice = {}) {
  return prepare_data_loader<Config>(loader, PrepareContext::of(state), std::move(slice));
}

namespace detail {
using UnpreparedConfig = Config<dist::none, place::none, rng::none>;
}  // namespace detail

template <LoaderDataset Dataset, class Collate>
auto DataLoader<Dataset, Collate>::begin() const {
  // A fresh one-process loader per epoch, so every epoch draws anew (the iterator keeps it alive).
  return detail::prepare<detail::UnpreparedConfig>(*this, PrepareContext{}, NoSlice{}, /*publish=*/false).begin();
}

}  // namespace accel::data
