#pragma once
//! \file
//! `prepare_data_loader<Config>(loader, state)`: the user's `DataLoader` made into the prepared loader of a
//! configuration, statically typed, and the names of the prepared loaders.
//!
//! | loader                    | dataset   | `loading`    | step source                              | transport           |
//! |---------------------------|-----------|--------------|------------------------------------------|---------------------|
//! | `ShardedLoader`           | map-style | `sharded`    | closed-form plan, or the user's batch sampler | `LocalTransport` |
//! | `DispatchedLoader`        | map-style | `dispatched` | closed-form plan (rank 0 fetches)        | `DispatchTransport` |
//! | `StreamShardedLoader`     | iterable  | `sharded`    | `IterableShard` of the stream            | `LocalTransport`    |
//! | `StreamDispatchedLoader`  | iterable  | `dispatched` | rank 0 reads the stream                  | `DispatchTransport` |
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
#include <accel/data/batch_sampler_source.hpp>
#include <accel/data/data_loader.hpp>
#include <accel/data/loader_core.hpp>
#include <accel/data/planned_source.hpp>
#include <accel/data/prepared_loader.hpp>
#include <accel/data/stream_source.hpp>
#include <accel/data/transport.hpp>

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

namespace accel::data {

//! A map-style dataset's sharded epoch: the closed-form plan, or the user's batch sampler when it has one.
template <class Dataset, class Collate, class Config>
class ShardedEpoch {
  using Planned = PlannedEpoch<Dataset, Collate, Config>;
  using Sampled = BatchSamplerEpoch<Dataset, Collate, Config>;

 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Payload = typename Core::Batch;

  explicit ShardedEpoch(const std::shared_ptr<Core>& c) : epoch_(start(c)) {}
  [[nodiscard]] std::int64_t count() const {
    return std::visit([](const auto& e) { return e.count(); }, epoch_);
  }
  [[nodiscard]] static std::size_t size(Core& k) { return k.options.batch_sampler ? Sampled::size(k) : Planned::size(k); }
  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) const {
    return std::visit([q](const auto& e) { return e.produce(q); }, epoch_);
  }
  //! Steps of the longest rank, and what a step publishes (Note [Joined steps] in gradient_state.hpp).
  [[nodiscard]] std::int64_t steps() const {
    return std::visit([](const auto& e) { return e.steps(); }, epoch_);
  }
  [[nodiscard]] GradientState::LoaderView view(std::int64_t q) const {
    return std::visit([q](const auto& e) { return e.view(q); }, epoch_);
  }

 private:
  static std::variant<Planned, Sampled> start(const std::shared_ptr<Core>& c) {
    if (c->options.batch_sampler) return std::variant<Planned, Sampled>(std::in_place_type<Sampled>, c);
    return std::variant<Planned, Sampled>(std::in_place_type<Planned>, c);
  }
  std::variant<Planned, Sampled> epoch_;
};

// [accelerate:data_loader.py DataLoaderShard]
//! Every process reads only its own batches (from the plan, or from its shard of the user's batch sampler),
//! places them, and publishes `end_of_dataloader` and the padding layout to `GradientState`.
template <class Dataset, class Collate, class Config>
using ShardedLoader = PreparedLoader<ShardedEpoch<Dataset, Collate, Config>, LocalTransport>;

// [accelerate:data_loader.py DataLoaderDispatcher]
//! Rank 0 reads and collates every global batch; every rank receives only its own slice (a scatter: each
//! rank gets about 1/N of the bytes a broadcast of the whole batch would send). The batch's structure must be
//! fixed (tensors, `torch::data::Example`, tuples, structs with `accel_fields`) unless a slice function is given;
//! shapes and dtypes travel as typed metadata; slice sizes come from the plan, which every rank computes alone.
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
using DispatchedLoader = PreparedLoader<PlannedEpoch<Dataset, Collate, Config>, DispatchTransport<Slice>>;

// [accelerate:data_loader.py DataLoaderShard over IterableDatasetShard]
//! An iterable dataset, sharded (stream_source.hpp).
template <class Dataset, class Collate, class Config>
using StreamShardedLoader = PreparedLoader<StreamShardEpoch<Dataset, Collate, Config>, LocalTransport>;

// [accelerate:data_loader.py DataLoaderDispatcher over an iterable dataset]
//! An iterable dataset, dispatched from rank 0 (stream_source.hpp).
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
using StreamDispatchedLoader = PreparedLoader<StreamDispatchEpoch<Dataset, Collate, Config>, DispatchTransport<Slice>>;

// [accelerate:data_loader.py prepare_data_loader]
//! The prepared loader for `Config` (`loading::sharded` -> ShardedLoader, `loading::dispatched` ->
//! DispatchedLoader; the stream variants for iterable datasets), statically typed. A shuffled loader's sampler is
//! drawn as Accelerate draws it: a generator seeded from the global one and synchronised at every epoch, or the
//! seedable sampler.
template <class Config, class Dataset, class Collate, class Slice = NoSlice>
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const PrepareContext& ctx, Slice slice = {}) {
  static_assert(Config::dispatch || std::is_same_v<Slice, NoSlice>,
                "accel: a slice function only applies to loading::dispatched (rank 0 cuts the global batch with it)");
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  const auto& o = loader.options();
  auto core = std::make_shared<Core>();
  core->dataset = loader.dataset();
  core->collate = loader.collate();
  core->options = o;
  core->ctx = ctx;
  if constexpr (IterableDataset<Dataset>) {
    accel::detail::require(!o.shuffle, "accel: an iterable dataset cannot be shuffled by the loader; shuffle the stream itself");
    accel::detail::require(!o.sampler && !o.batch_sampler, "accel: an iterable dataset has no indices to sample; drop sampler/batch_sampler");
  }
  accel::detail::require(!(o.sampler && o.batch_sampler), "accel: give a sampler or a batch_sampler, not both");
  accel::detail::require(!(o.shuffle && (o.sampler || o.batch_sampler)),
                         "accel: shuffle=true with a sampler of your own: shuffle inside the sampler, or drop it");
  if (o.batch_sampler) {
    accel::detail::require(!Config::split_batches, "accel: batches::split needs a fixed batch size; a batch sampler's batches "
                                                   "vary: use batches::per_process");
    accel::detail::require(!Config::dispatch, "accel: a batch sampler with loading::dispatched is not available; use loading::sharded");
  }
  // The one validation of the sharding rules, strict on every path (Accelerate's prepare_data_loader refuses
  // split_batches with a batch size that is not a round multiple of the processes, even where its classes would not).
  plan::validate(core->spec(ctx.process_index), plan::Loading::sharded, /*varying_ok=*/bool(o.batch_sampler));
  if constexpr (MapDataset<Dataset>) {
    // Under dispatch only rank 0 samples: one process's view of the sampler (no synchronisation). A stream has no
    // indices to shuffle (refused above), nor, in general, a size.
    if (o.shuffle)
      core->orders = std::make_shared<ShuffledOrders>(loader.dataset()->size(), Config::dispatch ? 1 : ctx.num_processes,
                                                      o.seedable ? Shuffle::seedable : Shuffle::synchronized, o.data_seed,
                                                      RandomSamplerOptions{}, o.seed);
  }
  if constexpr (IterableDataset<Dataset> && Config::dispatch)
    return StreamDispatchedLoader<Dataset, Collate, Config, Slice>(core, DispatchTransport<Slice>{std::move(slice)});
  else if constexpr (IterableDataset<Dataset>)
    return StreamShardedLoader<Dataset, Collate, Config>(core);
  else if constexpr (Config::dispatch)
    return DispatchedLoader<Dataset, Collate, Config, Slice>(core, DispatchTransport<Slice>{std::move(slice)});
  else
    return ShardedLoader<Dataset, Collate, Config>(core);
}

//! `prepare_data_loader` for this process (`ProcessState`, or anything with its accessors).
template <class Config, class Dataset, class Collate, class State, class Slice = NoSlice>
  requires requires(const State& s) { s.comm(); s.device(); }
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const State& state, Slice slice = {}) {
  return prepare_data_loader<Config>(loader, PrepareContext::of(state), std::move(slice));
}

namespace detail {
using UnpreparedConfig = Config<dist::none, place::none, rng::none>;
}  // namespace detail

template <LoaderDataset Dataset, class Collate>
auto DataLoader<Dataset, Collate>::begin() const {
  // A fresh one-process loader per epoch, so every epoch draws anew (the iterator keeps it alive).
  auto loader = prepare_data_loader<detail::UnpreparedConfig>(*this, PrepareContext{});
  loader.core()->publish = false;
  return loader.begin();
}

}  // namespace accel::data
