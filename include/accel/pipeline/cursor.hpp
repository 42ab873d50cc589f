#pragma once
//! \file
//! `Cursor<Source, Transport>`: one epoch of a prepared loader in progress (data/prepared_loader.hpp), for every
//! step:
//!
//!     step -> fetch      the source, on the loader's workers (`DataLoaderOptions::workers`), ahead of the loop,
//!                        and the transport's packing (dispatched loading cuts rank 0's global batch there)
//!          -> transport  on the loop's thread (dispatched loading's collectives keep their order)
//!          -> place      the batch on the process's device (sharded loading places it on the worker)
//!          -> publish    end_of_dataloader and every rank's rows to `GradientState`, while the loop holds it
//!
//! The loader's iterator (`data::detail::PassIterator`) steps it with `advance()` and ends the epoch with `finish()`.
//!
//! pipeline/ (namespace `accel::pipeline`) is the machinery of a prepared loader, what no user names: the step
//! sources (`*_source.hpp`, classes `*Source`), the transports, the loader core, this cursor, the workers
//! (prefetcher.hpp), placement and the plan view. The user's vocabulary, and the loaders a user holds, are data/'s
//! (data/loader.hpp says which file is where). The pipeline's layer is above data/'s vocabulary and below its loaders.

#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/prefetcher.hpp>
#include <accel/pipeline/transport.hpp>
#include <accel/state/gradient_state.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace accel::pipeline {

//! One epoch in progress: the source's epoch, its workers, the batch the loop holds and its publication.
template <class Source, class Transport>
struct Cursor {
  using Core = typename Source::Core;
  using Batch = typename Core::Batch;

  Cursor(const std::shared_ptr<Core>& c, std::shared_ptr<const Transport> t)
      : core(c),
        transport(std::move(t)),
        registration(core->publish ? &GradientState::instance() : nullptr),
        source(core) {
    prefetcher.emplace(source.count(), core->options.workers, core->options.prefetch, [this](std::int64_t q) {
      auto f = source.produce(q);
      if (f) transport->pack(*core, *f);  // on the worker, ahead of the loop
      return f;
    });
    if constexpr (requires { source.steps(); })  // this rank runs out first: Note [Joined steps]
      if (missing() > 0) {
        std::vector<GradientState::LoaderView> views;
        for (std::int64_t q = source.count(); q < source.steps(); ++q) views.push_back(source.view(q));
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
    if constexpr (requires { source.steps(); })
      return core->publish ? source.steps() - source.count() : 0;
    else
      return 0;
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
  Source source;
  std::optional<detail::Prefetcher<detail::Fetched<typename Source::Payload>>> prefetcher;
  std::optional<Batch> current;
  bool joined = false;
};

}  // namespace accel::pipeline
