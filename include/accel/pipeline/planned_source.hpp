#pragma once
//! \file
//! `PlannedSource`, the planned step source: a map-style dataset's epoch from the closed-form plans (plan/plan.hpp).
//! Every rank computes every rank's plan alone, so the last step, each rank's padding rows (for
//! `gather_for_metrics`) and skipping need no look-ahead and no communication. Which rank reads is the transport's
//! (transport.hpp): where every rank reads (sharded loading) it fetches this rank's batch; where one rank reads
//! (dispatched loading) it fetches, on that rank, the union of every rank's slice of the step (the global batch) and
//! describes the cut for the transport.

#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/plan_view.hpp>
#include <accel/pipeline/transport.hpp>
#include <accel/plan/plan.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace accel::pipeline {

template <class Dataset, class Collate, class Config, class Transport>
class PlannedSource {
 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config, Transport>;
  using Batch = typename Core::Batch;
  using Payload = typename Transport::template payload_type<Batch>;
  static_assert(
      EveryRankReads<Transport, Batch> || OneRankReads<Transport, Batch>,
      "accel: PlannedSource fetches either this rank's batch (a transport where every rank reads: LocalTransport) "
      "or, on the one reading rank, the global batch and its description (DispatchTransport); this transport is "
      "neither");

  explicit PlannedSource(const std::shared_ptr<Core>& c) : core_(c) {
    auto& k = *core_;
    data::IndexOrder order = k.begin_epoch();
    auto all = std::make_shared<std::vector<plan::BatchPlan>>();
    for (int r = 0; r < k.ctx.num_processes; ++r) all->push_back(k.plan_of(r).skip(k.skip));
    plans_ = std::move(all);
    lead_ = (*plans_)[std::size_t(Transport::reader_of(k.ctx.process_index))];
    if constexpr (!Transport::single_reader) {  // with one reader every rank runs its steps
      for (int r = 0; r < k.ctx.num_processes; ++r) steps_ = std::max(steps_, (*plans_)[std::size_t(r)].size());
      for (int r = 0; r < k.ctx.num_processes && steps_ > 0; ++r)
        if ((*plans_)[std::size_t(r)].size() == 0) {
          starved_ = r;
          break;
        }
    }
    view_ = planned_batches(lead_, std::move(order));
    k.run_epoch(lead_.skipped(), lead_.size());
  }
  //! Steps this rank runs (with one reader, every rank runs the reader's steps).
  [[nodiscard]] std::int64_t count() const noexcept { return lead_.size(); }
  //! Steps of the longest rank (uneven tails: more than `count()` on the ranks that run out first).
  [[nodiscard]] std::int64_t steps() const noexcept { return std::max(steps_, count()); }
  //! What step `q` of the epoch publishes (for a step this rank has no batch of, too: Note [Joined steps]).
  [[nodiscard]] GradientState::LoaderView view(std::int64_t q) const {
    return {.end_of_dataloader = lead_.end_of_dataloader(q),
            .plans = plans_,
            .batch = q,
            .steps = Transport::single_reader ? -1 : steps(),
            .starved = starved_};
  }
  [[nodiscard]] static std::size_t size(Core& k) {
    return std::size_t(k.plan_of(Transport::reader_of(k.ctx.process_index)).skip(k.skip).size());
  }

  //! Step `q` of the epoch (after the skipped ones). Called from the loader's workers, concurrently for distinct `q`.
  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) const {
    const auto& k = *core_;
    detail::Fetched<Payload> f{{}, view(q)};
    if constexpr (!Transport::single_reader) {
      thread_local std::vector<std::int64_t> idx;  // one index buffer per thread, reused batch after batch
      view_[std::ptrdiff_t(q)].indices_into(idx);
      f.payload = k.placement()(
          detail::fetch_batch(*k.dataset, k.collate, idx, q + lead_.skipped(), k.epoch, k.ctx.process_index));
    } else if (Transport::reads_on(k.ctx.process_index)) {
      // The step's global batch: the positions from the first rank's slice to the last one's.
      auto& step = f.payload.step;
      std::int64_t start = INT64_MAX, stop = 0;
      for (const auto& p : *plans_) {
        const auto s = p.span(q);
        if (s.size() > 0) start = std::min(start, s.begin), stop = std::max(stop, s.end);
      }
      if (start == INT64_MAX) start = stop = 0;
      step.has_step = true;
      step.end = lead_.end_of_dataloader(q);
      for (const auto& p : *plans_) {
        const auto s = p.span(q);
        step.begin.push_back(s.size() > 0 ? s.begin - start : 0);
        step.size.push_back(s.size());
        step.real.push_back(p.real(q));
      }
      std::vector<std::int64_t> idx;
      for (auto pos = start; pos < stop; ++pos) idx.push_back(view_.order()[lead_.sample(pos)]);
      try {
        if (!idx.empty())
          f.payload.global.emplace(
              detail::fetch_batch(*k.dataset, k.collate, idx, q + lead_.skipped(), k.epoch, k.ctx.process_index));
      } catch (const std::exception& e) {
        step.error = e.what();  // sent to every rank so that all of them stop with it
      }
    }
    return f;
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<const std::vector<plan::BatchPlan>> plans_;
  plan::BatchPlan lead_;    // the plan of this rank's reader (itself, or the one reader whose steps every rank follows)
  std::int64_t steps_ = 0;  // the longest rank's steps (sharded)
  int starved_ = -1;        // a rank without any batch while others have some
  PlannedBatches view_;
};

}  // namespace accel::pipeline
