#pragma once
//! \file
//! `IterableShard`: Accelerate's `IterableDatasetShard` over any input range of samples, streamed.
//!
//! The source is read in chunks of `R = batch_size` (split) or `batch_size * num_processes` samples; this
//! process keeps `batch_size / num_processes` (split) or `batch_size` consecutive samples of each chunk. A
//! last, incomplete chunk is completed by repeating the first chunk, unless `drop_last`. Each yielded
//! sample says whether it is such a padding duplicate. Memory: two chunks.
//!
//! `start` (a job resumed at another number of processes): the first `start` samples of the stream are read and
//! dropped; the chunks start after them, and the padding still repeats the stream's first chunk.

#include <accel/data/pass_iterator.hpp>
#include <accel/error.hpp>
#include <accel/plan/plan.hpp>

#include <range/v3/range/concepts.hpp>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <vector>

namespace accel::data {

//! One sample of an `IterableShard`, marked when it is padding.
template <class T>
struct ShardSample {
  T value;                      //!< the sample
  bool padding = false;         //!< a duplicate completing the last chunk
  std::int64_t chunk_real = 0;  //!< real (not padding) samples in the chunk this one comes from, for every rank
};

// [accelerate:data_loader.py IterableDatasetShard.__iter__]
//! Accelerate's `IterableDatasetShard` over any input range of samples, streamed: each rank takes its part of every
//! chunk of `batch_size * num_processes` samples (or `batch_size` under `split_batches`); a last, incomplete chunk is
//! completed by repeating the first one, unless `drop_last`. Yields `ShardSample`s.
template <std::ranges::input_range Source>
class IterableShard : public std::ranges::view_interface<IterableShard<Source>> {
  using T = std::ranges::range_value_t<Source>;
  using Options = plan::ShardSpec;

  struct Pass {
    Pass(std::shared_ptr<Source> s, const Options& o, std::int64_t start)
        : source(std::move(s)), opt(o), it(std::ranges::begin(*source)), last(std::ranges::end(*source)) {
      chunk = plan::per_step(opt);
      per = plan::per_process(opt);
      buffer.reserve(std::size_t(chunk));
      for (; start > 0 && it != last; --start, ++it) keep_first(*it);
    }
    std::shared_ptr<Source> source;
    Options opt;
    std::ranges::iterator_t<Source> it;
    std::ranges::sentinel_t<Source> last;
    std::int64_t chunk, per;
    std::vector<T> buffer, first;
    std::size_t yield_from = 0, yield_to = 0;  // owned positions of `buffer` still to yield
    std::int64_t real_end = 0;                 // positions of `buffer` below this are real samples
    bool finished = false;
    ShardSample<T> current{};

    void own(std::int64_t real) {
      yield_from = std::size_t(opt.process_index * per);
      yield_to = std::size_t(opt.process_index * per + per);
      real_end = real;
    }
    // The stream's first chunk (the padding pool), sample by sample.
    void keep_first(const T& x) {
      if (std::int64_t(first.size()) < chunk) first.push_back(x);
    }
    bool refill() {
      buffer.clear();
      while (it != last) {
        buffer.push_back(*it);
        keep_first(buffer.back());
        ++it;
        if (std::int64_t(buffer.size()) == chunk) {
          own(chunk);
          return true;
        }
      }
      if (finished) return false;
      finished = true;
      if (opt.drop_last || buffer.empty()) return false;
      const auto real = std::int64_t(buffer.size());
      while (std::int64_t(buffer.size()) < chunk) buffer.insert(buffer.end(), first.begin(), first.end());
      own(real);
      return true;
    }
    bool advance() {
      while (yield_from >= yield_to)
        if (!refill()) return false;
      current = {buffer[yield_from], std::int64_t(yield_from) >= real_end, real_end};
      ++yield_from;
      return true;
    }
  };

 public:
  using iterator = detail::PassIterator<Pass, ShardSample<T>>;  //!< a single-pass input iterator

  IterableShard() = default;
  //! Shards `source` as `opt` says, after dropping its first `start` samples (a job resumed at another size).
  IterableShard(Source source, Options opt, std::int64_t start = 0)
      : source_(std::make_shared<Source>(std::move(source))), opt_(opt), start_(start) {
    plan::validate(opt, plan::Loading::iterable);
    accel::detail::require(start >= 0, "accel: IterableShard: a negative start (" + std::to_string(start) + ")");
  }
  //! Starts a new pass over the source.
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Pass>(source_, opt_, start_)); }
  //! The end of a pass.
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  std::shared_ptr<Source> source_;
  Options opt_;
  std::int64_t start_ = 0;
};

//! Deduces the source's view type (`IterableShard(samples, spec)`).
template <class S>
IterableShard(S&&, plan::ShardSpec) -> IterableShard<std::views::all_t<S>>;
//! Deduces the source's view type (`IterableShard(samples, spec, start)`).
template <class S>
IterableShard(S&&, plan::ShardSpec, std::int64_t) -> IterableShard<std::views::all_t<S>>;

}  // namespace accel::data

// range-v3's customisation point (these ranges are views), not one of accel's names: out of the API reference.
//! \cond
template <class S>
inline constexpr bool ranges::enable_view<accel::data::IterableShard<S>> = true;
//! \endcond
