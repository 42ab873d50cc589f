#pragma once
//! \file
//! `ShardedSource`: a map-style dataset's step source under sharded loading, the closed-form plans
//! (`PlannedSource`) or, when the loader has one, the user's batch sampler (`BatchSamplerSource`), chosen per epoch.

#include <accel/pipeline/batch_sampler_source.hpp>
#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/planned_source.hpp>
#include <accel/pipeline/transport.hpp>
#include <accel/state/gradient_state.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <variant>

namespace accel::pipeline {

//! A map-style dataset's sharded source: the closed-form plan, or the user's batch sampler when it has one.
template <class Dataset, class Collate, class Config, class Transport>
class ShardedSource {
  using Planned = PlannedSource<Dataset, Collate, Config, Transport>;
  using Sampled = BatchSamplerSource<Dataset, Collate, Config, Transport>;

 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config, Transport>;
  using Payload = typename Transport::template payload_type<typename Core::Batch>;
  static_assert(
      EveryRankReads<Transport, typename Core::Batch>,
      "accel: ShardedSource has every rank fetch its own batches: it needs a transport where every rank reads "
      "(LocalTransport, loading::sharded)");

  explicit ShardedSource(const std::shared_ptr<Core>& c) : source_(start(c)) {}
  [[nodiscard]] std::int64_t count() const {
    return std::visit([](const auto& e) { return e.count(); }, source_);
  }
  [[nodiscard]] static std::size_t size(Core& k) {
    return k.options.batch_sampler ? Sampled::size(k) : Planned::size(k);
  }
  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) const {
    return std::visit([q](const auto& e) { return e.produce(q); }, source_);
  }
  //! Steps of the longest rank, and what a step publishes (Note [Joined steps] in gradient_state.hpp).
  [[nodiscard]] std::int64_t steps() const {
    return std::visit([](const auto& e) { return e.steps(); }, source_);
  }
  [[nodiscard]] GradientState::LoaderView view(std::int64_t q) const {
    return std::visit([q](const auto& e) { return e.view(q); }, source_);
  }

 private:
  static std::variant<Planned, Sampled> start(const std::shared_ptr<Core>& c) {
    if (c->options.batch_sampler) return std::variant<Planned, Sampled>(std::in_place_type<Sampled>, c);
    return std::variant<Planned, Sampled>(std::in_place_type<Planned>, c);
  }
  std::variant<Planned, Sampled> source_;
};

}  // namespace accel::pipeline
