#pragma once
//! \file
//! `PreparedLoader<Source, Transport>`: the one prepared loader, what `prepare_data_loader` returns. Every loading
//! path is this template with a step source (`Source`: pipeline/planned_source.hpp, pipeline/sharded_source.hpp,
//! pipeline/stream_source.hpp) and a transport (pipeline/transport.hpp); `ShardedLoader`, `DispatchedLoader` and the
//! stream variants are its names (prepare.hpp). An epoch is one `pipeline::Cursor` (pipeline/cursor.hpp: step,
//! fetch, transport, place, publish).
//!
//! A prepared loader is a cheap, copyable range handle over shared state (copies iterate the same loader),
//! single-pass per epoch; `size()` is the number of batches really yielded. The shared state (the pipeline's
//! `LoaderCore`) is not handed out: the handle's members are what a user reads and sets of it.

#include <accel/data/loader_state.hpp>
#include <accel/data/pass_iterator.hpp>
#include <accel/pipeline/cursor.hpp>
#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/transport.hpp>
#include <accel/plan/plan.hpp>

#include <range/v3/range/concepts.hpp>

#include <cstdint>
#include <iterator>
#include <memory>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>

namespace accel::data {

//! The prepared loader, what `prepare_data_loader` returns (`ShardedLoader`, `DispatchedLoader` and the stream variants
//! are its names): a cheap, copyable range handle over shared state, one pass per epoch; `set_epoch`, `epoch`, `size`,
//! `state_dict` / `load_state_dict`, `skip_first_batches` (see the file's comment).
template <class Source, class Transport>
class PreparedLoader : public std::ranges::view_interface<PreparedLoader<Source, Transport>> {
 public:
  using Core = typename Source::Core;  //!< the pipeline's shared state
  using Batch = typename Core::Batch;  //!< what the loop receives
  static_assert(
      std::is_same_v<typename Core::transport, Transport>,
      "accel: PreparedLoader: the step source was made for another transport than the loader's (a source names "
      "its transport: PlannedSource<Dataset, Collate, Config, Transport>)");
  static_assert(
      Core::config::dispatch == Transport::single_reader,
      "accel: PreparedLoader: the configuration's loading policy and the transport disagree: loading::dispatched "
      "reads on rank 0 alone (DispatchTransport), loading::sharded on every rank (LocalTransport)");

 private:
  using Cursor = pipeline::Cursor<Source, Transport>;

 public:
  using iterator = detail::PassIterator<Cursor, Batch>;  //!< a single-pass input iterator

  PreparedLoader() = default;
  //! A handle on `core` (`prepare_data_loader` makes it).
  explicit PreparedLoader(std::shared_ptr<Core> core, Transport transport = {})
      : core_(std::move(core)), transport_(std::make_shared<const Transport>(std::move(transport))) {}

  //! Starts an epoch (synchronising the RNGs of the configuration's `rng` policy first).
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Cursor>(core_, transport_)); }
  //! The end of an epoch.
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }
  //! Batches (steps, when dispatched) this process yields in its next epoch: the number really yielded (Q4, Q5
  //! fixed). For a stream only when its length is known.
  [[nodiscard]] std::size_t size() const requires requires(Core& k) { Source::size(k); }
  { return Source::size(*core_); }
  //! The dataset's length (Accelerate's `total_dataset_length`); map-style datasets only.
  [[nodiscard]] std::int64_t total_dataset_length() const requires MapDataset<typename Core::dataset_type> {
    return core_->dataset->size();
  }

  //! The epoch the next iteration runs (also the seedable sampler's epoch).
  void set_epoch(std::int64_t epoch) { core_->epoch = epoch; }
  //! The epoch the next iteration runs; after `load_state`, the checkpoint's (loop from it to resume).
  [[nodiscard]] std::int64_t epoch() const noexcept { return core_->epoch; }
  //! Samples of one optimizer step across all processes (defined for every loader: Q7 fixed).
  [[nodiscard]] std::int64_t total_batch_size() const {
    return plan::per_step({.batch_size = core_->options.batch_size,
                           .num_processes = core_->ctx.num_processes,
                           .split_batches = Core::config::split_batches});
  }
  //! Where the loader stands: a fresh process that loads it yields exactly the remaining batches. The position is
  //! global (`LoaderState::position`): a job of another number of processes resumes from any rank's state (rank 0's
  //! is the one `Accelerator::load_state` uses).
  [[nodiscard]] LoaderState state_dict() const { return core_->state(); }
  //! Resumes from `s`, saved by a job of any number of processes: the rest of the interrupted epoch is the samples
  //! that job had not consumed, sharded for this one; later epochs are this job's.
  //! `GlobalGenerator::restored_by_caller`: the caller restores the global generator itself (`Accelerator::load_state`
  //! does), so a loader drawing from it must not leave it at the epoch's start. Throws `InvalidArgument` when `s` comes
  //! from another kind of loader.
  void load_state_dict(const LoaderState& s, GlobalGenerator g = GlobalGenerator::rewound_by_loader) {
    core_->load(s, g);
  }
  //! What differs between the loader that saved `s` and this one (its path, dataset length or batch size), as the
  //! rest of a sentence ("was saved for a dataset of 1797 samples, this loader's has 1200"); "" when none does.
  [[nodiscard]] std::string state_mismatch(const LoaderState& s) const { return core_->mismatch(s); }
  //! What makes `s` (of this loader's path, length and batch size) a state no job of this loader reaches: a position
  //! past the epoch's end or between batches, a batch count that does not reach it, no generator state for a
  //! shuffled order; "" when nothing does.
  [[nodiscard]] std::string state_unreachable(const LoaderState& s) const { return core_->unreachable(s); }
  //! The same loader without the first `k` batches (steps, when dispatched) of its next epoch: Accelerate's
  //! `skip_first_batches`. It shares the sampler and the epoch counter, and keeps the padding marks.
  [[nodiscard]] PreparedLoader skip_first_batches(std::int64_t k) const {
    accel::detail::require(
        k >= 0, "accel: skip_first_batches: cannot skip a negative number of batches (" + std::to_string(k) + ")");
    PreparedLoader out = *this;
    out.core_ = std::make_shared<Core>(*core_);
    out.core_->skip += k;
    return out;
  }
  //! Bytes this rank received from dispatched loading so far, and what a broadcast of every global batch
  //! (Accelerate's transport) would have sent it. Zero for sharded loading.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> transport_bytes() const {
    return {core_->bytes_received, core_->bytes_broadcast_equivalent};
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<const Transport> transport_;
};

}  // namespace accel::data

// range-v3's customisation point (these ranges are views), not one of accel's names: out of the API reference.
//! \cond
template <class S, class T>
inline constexpr bool ranges::enable_view<accel::data::PreparedLoader<S, T>> = true;
//! \endcond
