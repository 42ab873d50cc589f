#pragma once
//! \file
//! `PreparedLoader<Epoch, Transport>`: the one prepared loader. Every loading path is this template with a step
//! source (`Epoch`: planned_source.hpp, batch_sampler_source.hpp, stream_source.hpp) and a transport
//! (transport.hpp); `ShardedLoader`, `DispatchedLoader` and the stream variants are its names (prepare.hpp).
//!
//! One epoch is one cursor that runs, for every step:
//!
//!     step -> fetch      the source, on the loader's workers (`DataLoaderOptions::workers`), ahead of the loop,
//!                        and the transport's packing (dispatched loading cuts rank 0's global batch there)
//!          -> transport  on the loop's thread (dispatched loading's collectives keep their order)
//!          -> place      the batch on the process's device (sharded loading places it on the worker)
//!          -> publish    end_of_dataloader and every rank's rows to `GradientState`, while the loop holds it
//!
//! A prepared loader is a cheap, copyable range handle over shared state (copies iterate the same loader),
//! single-pass per epoch; `size()` is the number of batches really yielded.

#include <accel/data/loader_core.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/pass_iterator.hpp>
#include <accel/data/prefetcher.hpp>
#include <accel/data/transport.hpp>
#include <accel/plan/plan.hpp>
#include <accel/state/gradient_state.hpp>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

namespace accel::data {

template <class Epoch, class Transport>
class PreparedLoader : public std::ranges::view_interface<PreparedLoader<Epoch, Transport>> {
 public:
  using Core = typename Epoch::Core;
  using Batch = typename Core::Batch;

 private:
  //! One epoch in progress: the source's epoch, its workers, the batch the loop holds and its publication.
  struct Cursor {
    Cursor(const std::shared_ptr<Core>& c, std::shared_ptr<const Transport> t)
        : core(c), transport(std::move(t)), registration(core->publish ? &GradientState::instance() : nullptr), epoch(core) {
      prefetcher.emplace(epoch.count(), core->options.workers, core->options.prefetch,
                         [this](std::int64_t q) {
                           auto f = epoch.produce(q);
                           if (f) transport->pack(*core, *f);  // on the worker, ahead of the loop
                           return f;
                         });
      if constexpr (requires { epoch.steps(); })  // this rank runs out first: Note [Joined steps]
        if (missing() > 0) {
          std::vector<GradientState::LoaderView> views;
          for (std::int64_t q = epoch.count(); q < epoch.steps(); ++q) views.push_back(epoch.view(q));
          registration.record_steps(std::move(views));
        }
    }
    ~Cursor() { prefetcher.reset(); }  // joins the workers before the epoch they read goes
    void finish() { core->end_epoch(); }
    bool advance() {
      registration.at_step_boundary();  // the step with the held batch is over (Options::preemption acts here)
      auto fetched = prefetcher->next();
      if (!fetched) {
        join();
        return false;
      }
      auto batch = transport->deliver(*core, *fetched);
      if (!batch) return false;
      current.emplace(std::move(*batch));
      core->placement().hand_over(*current);
      registration.update(std::move(fetched->view));
      ++core->handed;
      return true;
    }
    // Steps the longest rank runs beyond this one's batches (uneven tails).
    [[nodiscard]] std::int64_t missing() const {
      if constexpr (requires { epoch.steps(); }) return core->publish ? epoch.steps() - epoch.count() : 0;
      else return 0;
    }
    // This rank's batches are over: take part in the steps the others still run (Note [Joined steps] in
    // gradient_state.hpp), with nothing of its own.
    void join() {
      if (missing() <= 0 || joined) return;
      joined = true;
      registration.join();  // false: this rank had no batch, and so no step to repeat (a starved rank)
    }
    std::shared_ptr<Core> core;
    std::shared_ptr<const Transport> transport;
    GradientState::Registration registration;
    Epoch epoch;
    std::optional<detail::Prefetcher<detail::Fetched<typename Epoch::Payload>>> prefetcher;
    std::optional<Batch> current;
    bool joined = false;
  };

 public:
  using iterator = detail::PassIterator<Cursor, Batch>;

  PreparedLoader() = default;
  explicit PreparedLoader(std::shared_ptr<Core> core, Transport transport = {})
      : core_(std::move(core)), transport_(std::make_shared<const Transport>(std::move(transport))) {}

  //! Starts an epoch (synchronising the RNGs of the configuration's `rng` policy first).
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Cursor>(core_, transport_)); }
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }
  //! Batches (steps, when dispatched) this process yields in its next epoch: the number really yielded (Q4, Q5
  //! fixed). For a stream only when its length is known.
  [[nodiscard]] std::size_t size() const
    requires requires(Core& k) { Epoch::size(k); }
  {
    return Epoch::size(*core_);
  }
  [[nodiscard]] std::int64_t total_dataset_length() const
    requires MapDataset<typename Core::dataset_type>
  {
    return core_->dataset->size();
  }

  //! The epoch the next iteration runs (also the seedable sampler's epoch).
  void set_epoch(std::int64_t epoch) { core_->epoch = epoch; }
  [[nodiscard]] std::int64_t epoch() const noexcept { return core_->epoch; }
  //! Samples of one optimizer step across all processes (defined for every loader: Q7 fixed).
  [[nodiscard]] std::int64_t total_batch_size() const {
    return plan::per_step({.batch_size = core_->options.batch_size, .num_processes = core_->ctx.num_processes,
                           .split_batches = Core::config::split_batches});
  }
  //! Where the loader stands: a fresh process that loads it yields exactly the remaining batches. The position is
  //! global (`LoaderState::position`): a job of another number of processes resumes from any rank's state (rank 0's
  //! is the one `Accelerator::load_state` uses).
  [[nodiscard]] LoaderState state_dict() const { return core_->state(); }
  //! Resumes from `s`, saved by a job of any number of processes: the rest of the interrupted epoch is the samples
  //! that job had not consumed, sharded for this one; later epochs are this job's. `GlobalGenerator::restored_by_caller`:
  //! the caller restores the global generator itself (`Accelerator::load_state` does), so a loader drawing from it
  //! must not leave it at the epoch's start. Throws `InvalidArgument` when `s` comes from another kind of loader.
  void load_state_dict(const LoaderState& s, GlobalGenerator g = GlobalGenerator::rewound_by_loader) { core_->load(s, g); }
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
    accel::detail::require(k >= 0, "accel: skip_first_batches: cannot skip a negative number of batches (" + std::to_string(k) + ")");
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
  //! The shared state (for the library's own wiring: the user's one-process `DataLoader` publishes nothing).
  [[nodiscard]] const std::shared_ptr<Core>& core() const noexcept { return core_; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<const Transport> transport_;
};

}  // namespace accel::data

template <class E, class T>
inline constexpr bool ranges::enable_view<accel::data::PreparedLoader<E, T>> = true;
