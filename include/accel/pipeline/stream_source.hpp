#pragma once
//! \file
//! The stream step sources: an iterable dataset (any input range of samples), read in order.
//!
//! * `StreamShardSource` (sharded loading: a transport where every rank reads): every process reads the stream and
//!   keeps its part of each chunk (`IterableShard`: `batch_size` samples of every `batch_size * N`, or
//!   `batch_size / N` of every `batch_size` under `batches::split`), the last chunk completed from the first unless
//!   `drop_last`. One process batches the stream as it comes (a short last batch). Every rank's real rows follow
//!   from the chunk.
//! * `StreamDispatchSource` (dispatched loading: a transport with one reader, rank 0): the reader alone reads the
//!   stream, in batches of `batch_size` (the user's `drop_last` applies to them); a step is N of them (one under
//!   `batches::split`). The last step is re-cut by `plan::dispatch_cut`, the dispatcher's rule shared with map-style
//!   loading. The other ranks learn each step (and the end) from the reader's description.
//!
//! Both read one batch (one step) ahead, so that a step knows whether it is the last (`end_of_dataloader`). The
//! reading runs in step order (`InOrder`), the collating on the loader's workers. Resuming re-reads the stream and
//! drops the items the saved job had consumed (`LoaderState::position`, items of the stream), then the batches of
//! `skip_first_batches`; the padding still repeats the stream's first items.

#include <accel/data/iterable_shard.hpp>
#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/prefetcher.hpp>
#include <accel/pipeline/transport.hpp>
#include <accel/plan/plan.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <utility>
#include <vector>

namespace accel::pipeline {

template <class Dataset, class Collate, class Config, class Transport>
class StreamShardSource {
 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config, Transport>;
  using Batch = typename Core::Batch;
  using Payload = typename Transport::template payload_type<Batch>;
  static_assert(EveryRankReads<Transport, Batch>,
                "accel: StreamShardSource has every rank read the stream and keep its part: it needs a transport where "
                "every rank reads (LocalTransport, loading::sharded)");

  explicit StreamShardSource(const std::shared_ptr<Core>& c)
      : core_(c), shard_(Source(*core_->dataset), core_->spec(core_->ctx.process_index), core_->start) {
    auto& k = *core_;
    // Only one pass over the source is started: single-pass streams are read once.
    if (k.ctx.num_processes == 1) {
      plain_.emplace(std::ranges::begin(*k.dataset));
      const auto stop = std::ranges::end(*k.dataset);
      for (std::int64_t s = k.start; s > 0 && *plain_ != stop; --s) ++*plain_;
    } else {
      it_.emplace(shard_.begin());
    }
    k.begin_epoch();
    ahead_ = read();
    for (std::int64_t s = k.skip; s > 0 && ahead_; --s) ahead_ = read(), ++first_;
    k.run_epoch(first_, count());
  }
  [[nodiscard]] static constexpr std::int64_t count() noexcept { return detail::unknown_count; }
  [[nodiscard]] static std::size_t size(Core& k) requires std::ranges::sized_range<const Dataset> {
    return std::size_t(k.plan_of(k.ctx.process_index).skip(k.skip).size());
  }

  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) {
    auto raw = order_.run(q, [&]() -> std::optional<std::pair<Raw, bool>> {
      if (!ahead_) return std::nullopt;
      Raw now = std::move(*ahead_);
      ahead_ = read();  // look-ahead: is this the last batch?
      return std::pair{std::move(now), !ahead_.has_value()};
    });
    if (!raw) return std::nullopt;
    const auto& k = *core_;
    Batch batch =
        k.placement()(detail::at_site({"collating batch", first_ + q, k.epoch, k.ctx.process_index, std::nullopt, true},
                                      [&] { return k.collate(raw->first.samples); }));
    return detail::Fetched<Payload>{std::move(batch),
                                    {.end_of_dataloader = raw->second, .direct = std::move(raw->first.layout)}};
  }

 private:
  using Sample = std::ranges::range_value_t<const Dataset>;
  using Source = std::ranges::ref_view<const Dataset>;
  struct Raw {
    std::vector<Sample> samples;
    GatherLayout layout;
  };
  // The next batch of this process, or nothing at the end of the stream.
  std::optional<Raw> read() {
    const auto& k = *core_;
    const int N = k.ctx.num_processes;
    Raw out;
    if (N == 1) {
      const auto stop = std::ranges::end(*k.dataset);
      for (auto& p = *plain_; p != stop && std::int64_t(out.samples.size()) < k.options.batch_size; ++p)
        out.samples.push_back(*p);
      const auto got = std::int64_t(out.samples.size());
      if (got == 0 || (k.options.drop_last && got < k.options.batch_size)) return std::nullopt;
      out.layout = {{got}, {got}};
      return out;
    }
    const std::int64_t per = plan::per_process(k.spec(k.ctx.process_index));
    std::int64_t chunk_real = 0;
    for (auto& i = *it_; i != std::default_sentinel && std::int64_t(out.samples.size()) < per; ++i) {
      out.samples.push_back((*i).value);
      chunk_real = (*i).chunk_real;
    }
    if (out.samples.empty()) return std::nullopt;
    for (int q = 0; q < N; ++q) {
      out.layout.size.push_back(per);
      out.layout.real.push_back(std::clamp<std::int64_t>(chunk_real - q * per, 0, per));
    }
    return out;
  }

  std::shared_ptr<Core> core_;
  data::IterableShard<Source> shard_;
  std::optional<std::ranges::iterator_t<data::IterableShard<Source>>> it_;
  std::optional<std::ranges::iterator_t<const Dataset>> plain_;
  std::optional<Raw> ahead_;
  std::int64_t first_ = 0;  // batches skipped
  detail::InOrder order_;
};

template <class Dataset, class Collate, class Config, class Transport>
class StreamDispatchSource {
 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config, Transport>;
  using Batch = typename Core::Batch;
  using Payload = typename Transport::template payload_type<Batch>;
  static_assert(OneRankReads<Transport, Batch>,
                "accel: StreamDispatchSource reads the stream on one rank and describes every step to the others: it "
                "needs a transport with one reader (DispatchTransport, loading::dispatched)");

  explicit StreamDispatchSource(const std::shared_ptr<Core>& c) : core_(c) {
    auto& k = *core_;
    k.begin_epoch();
    if (Transport::reads_on(k.ctx.process_index)) {
      reader_.emplace(std::ranges::begin(*k.dataset));
      const auto stop = std::ranges::end(*k.dataset);
      for (std::int64_t s = k.start; s > 0 && *reader_ != stop; --s, ++*reader_) keep_first(**reader_);
      ahead_ = read_step();
      for (std::int64_t s = k.skip; s > 0 && ahead_; --s) ahead_ = read_step();
    }
    first_ = k.skip;
    k.run_epoch(first_, count());
  }
  //! The reader says when the stream ends; until then every rank has a step to take part in.
  [[nodiscard]] static constexpr std::int64_t count() noexcept { return detail::unknown_count; }
  [[nodiscard]] static std::size_t size(Core& k) requires std::ranges::sized_range<const Dataset> {
    return std::size_t(k.plan_of(Transport::reader_of(k.ctx.process_index)).skip(k.skip).size());
  }

  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) {
    detail::Fetched<Payload> f;
    const auto& k = *core_;
    const int N = k.ctx.num_processes;
    if (!Transport::reads_on(k.ctx.process_index)) return f;
    auto raw = order_.run(q, [&]() -> std::optional<std::pair<std::vector<Sample>, bool>> {
      if (!ahead_) return std::nullopt;
      std::vector<Sample> now = std::move(*ahead_);
      ahead_ = read_step();
      return std::pair{std::move(now), !ahead_.has_value()};
    });
    if (!raw) return f;  // no step: the reader tells the others so
    auto& [samples, last] = *raw;
    auto& step = f.payload.step;
    const auto cut = plan::dispatch_cut(std::int64_t(samples.size()), N, last, k.options.drop_last,
                                        std::int64_t(first_samples_.size()));
    if (cut.total > cut.observed) samples.insert(samples.end(), first_samples_.begin(), first_samples_.end());
    step.has_step = true;
    step.end = last;
    step.cut(cut, N);
    try {
      f.payload.global.emplace(
          detail::at_site({"collating step", first_ + q, k.epoch, k.ctx.process_index, std::nullopt, true},
                          [&] { return k.collate(samples); }));
    } catch (const std::exception& e) {
      step.error = e.what();  // sent to every rank so that all of them stop with it
    }
    return f;
  }

 private:
  using Sample = std::ranges::range_value_t<const Dataset>;
  // The reader: the samples of the next step, or nothing at the end of the stream.
  std::optional<std::vector<Sample>> read_step() {
    const auto& k = *core_;
    const std::int64_t B = k.options.batch_size;
    const int batches = Config::split_batches ? 1 : k.ctx.num_processes;
    std::vector<Sample> step;
    const auto stop = std::ranges::end(*k.dataset);
    int full = 0;
    for (int b = 0; b < batches; ++b) {
      std::vector<Sample> inner;
      for (auto& it = *reader_; it != stop && std::int64_t(inner.size()) < B; ++it) inner.push_back(*it);
      if (inner.empty() || (k.options.drop_last && std::int64_t(inner.size()) < B)) break;
      step.insert(step.end(), inner.begin(), inner.end());
      ++full;
      if (std::int64_t(inner.size()) < B) break;
    }
    if (step.empty() || (k.options.drop_last && full < batches)) return std::nullopt;
    for (std::size_t i = 0; i < step.size() && first_samples_.size() < std::size_t(k.ctx.num_processes); ++i)
      keep_first(step[i]);
    return step;
  }
  // The epoch's first N samples: what the last step is padded with.
  void keep_first(const Sample& x) {
    if (first_samples_.size() < std::size_t(core_->ctx.num_processes)) first_samples_.push_back(x);
  }

  std::shared_ptr<Core> core_;
  std::optional<std::ranges::iterator_t<const Dataset>> reader_;  // the reader only
  std::optional<std::vector<Sample>> ahead_;
  std::vector<Sample> first_samples_;
  std::int64_t first_ = 0;  // steps skipped
  detail::InOrder order_;
};

}  // namespace accel::pipeline
