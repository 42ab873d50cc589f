#pragma once
//! \file
//! `BatchSamplerShard`: Accelerate's sharding of *any* batch sampler, streamed.
//!
//! The closed-form plans of `plan.hpp` cover a batch sampler of fixed batch size over an index order. This
//! view covers the rest: a user's batch sampler that yields lists of indices of any sizes (a max-tokens
//! bucketing sampler, say), with `batch_size = plan::varying`. It runs Accelerate's algorithm
//! step by step, holding at most one round of batches (the padding pool), so it works on unsized,
//! single-pass sources too.
//!
//! \code
//! std::vector<std::vector<std::int64_t>> batches{{0, 1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10, 11}, {12, 13}};
//! accel::data::BatchSamplerShard shard(batches, {.batch_size = accel::plan::varying, .num_processes = 2,
//! .process_index = 1}); for (const auto& b : shard) ...;   // {3,4}, {9,10,11}, then the padding batch {0,1,2} (b.real
//! == 0) \endcode

#include <accel/data/pass_iterator.hpp>
#include <accel/error.hpp>
#include <accel/plan/plan.hpp>

#include <range/v3/range/concepts.hpp>

#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <vector>

namespace accel::data {

//! One batch a shard yields: dataset indices, of which the first `real` are real samples and the rest padding.
struct ShardBatch {
  std::vector<std::int64_t> indices;  //!< dataset indices, real samples first
  std::int64_t real = 0;              //!< how many leading indices are real
  friend bool operator==(const ShardBatch&, const ShardBatch&) = default;
};

// [accelerate:data_loader.py BatchSamplerShard]
//! The spec's `batch_size` and `drop_last` are the wrapped sampler's attributes: `batch_size = plan::varying`
//! means batches of any size.
template <std::ranges::input_range Sampler>
requires std::ranges::input_range<std::ranges::range_reference_t<Sampler>>
class BatchSamplerShard : public std::ranges::view_interface<BatchSamplerShard<Sampler>> {
  using Options = plan::ShardSpec;
  using Batch = std::vector<std::int64_t>;

  // One pass over the wrapped sampler (shared by the copies of an iterator).
  struct Pass {
    Pass(std::shared_ptr<Sampler> s, const Options& o)
        : sampler(std::move(s)), opt(o), it(std::ranges::begin(*sampler)), last(std::ranges::end(*sampler)) {}
    std::shared_ptr<Sampler> sampler;
    Options opt;
    std::ranges::iterator_t<Sampler> it;
    std::ranges::sentinel_t<Sampler> last;
    std::int64_t idx = -1;           // index of the last batch read
    Batch batch;                     // the last batch read
    Batch pending;                   // no split: the latest batch of this process, not yet yielded
    Batch first;                     // split: the first batch; no split: first round, flattened (fixed size)
    std::vector<Batch> first_round;  // no split, dynamic sizes: the first round, batch by batch
    std::deque<ShardBatch> ready;
    bool done = false;
    ShardBatch current;

    [[nodiscard]] bool varying() const { return opt.batch_size == plan::varying; }
    [[nodiscard]] bool full(const Batch& b) const { return varying() || std::int64_t(b.size()) == opt.batch_size; }
    void emit(Batch b, std::int64_t real) { ready.push_back({std::move(b), real}); }

    // Reads batches until something is ready or the sampler is exhausted (then runs the tail once).
    void fill() {
      const std::int64_t N = opt.num_processes, r = opt.process_index;
      while (ready.empty() && !done) {
        if (it == last) {
          tail();
          done = true;
          break;
        }
        batch.assign(std::ranges::begin(*it), std::ranges::end(*it));
        ++it;
        ++idx;
        if (opt.split_batches) {
          if (idx == 0) first = batch;
          const std::int64_t per = plan::per_process(opt);
          if (full(batch)) emit(slice(batch, r * per, per), per);
          continue;
        }
        if (!opt.drop_last && idx < N) {
          if (!varying())
            first.insert(first.end(), batch.begin(), batch.end());
          else
            first_round.push_back(batch);
        }
        if (idx % N == r) pending = batch;
        if (idx % N == N - 1 && full(batch)) {
          // Accelerate yields `batch_to_yield` even when it is empty (a process with no batch in the round
          // cannot happen here: a full round gives every process one).
          const auto real = std::int64_t(pending.size());
          emit(std::move(pending), real);
          pending.clear();
        }
      }
    }

    static Batch slice(const Batch& b, std::int64_t from, std::int64_t count) {
      const auto lo = std::min<std::int64_t>(from, std::int64_t(b.size()));
      const auto hi = std::min<std::int64_t>(from + count, std::int64_t(b.size()));
      return Batch(b.begin() + lo, b.begin() + hi);
    }

    void tail() {
      if (opt.drop_last || idx < 0) return;
      const std::int64_t N = opt.num_processes, r = opt.process_index;
      if (opt.split_batches) {
        const std::int64_t B = opt.batch_size, per = plan::per_process(opt);
        if (std::int64_t(batch.size()) >= B) return;
        if (!opt.even_batches) {
          if (std::int64_t(batch.size()) > r * per) {
            Batch s = slice(batch, r * per, per);
            emit(s, std::int64_t(s.size()));
          }
          return;
        }
        Batch pool = first;
        while (std::int64_t(pool.size()) < B) {
          const Batch copy = pool;
          pool.insert(pool.end(), copy.begin(), copy.end());
        }
        Batch padded = batch;
        const auto real_total = std::int64_t(padded.size());
        padded.insert(padded.end(), pool.begin(), pool.end());
        emit(slice(padded, r * per, per), std::clamp<std::int64_t>(real_total - r * per, 0, per));
        return;
      }
      if (!opt.even_batches) {
        if (!pending.empty()) emit(pending, std::int64_t(pending.size()));
        return;
      }
      if (varying()) {  // batches of varying sizes: pad with whole batches of the first round
        if (!pending.empty()) emit(pending, std::int64_t(pending.size()));
        std::vector<Batch> pool = first_round;
        while (std::int64_t(pool.size()) < N) {
          const auto copy = pool;
          pool.insert(pool.end(), copy.begin(), copy.end());
        }
        std::int64_t slot = idx + 1;
        for (std::size_t c = 0; slot % N != 0; ++c, ++slot)
          if (slot % N == r) emit(pool[c], 0);
        return;
      }
      const std::int64_t B = opt.batch_size;
      if (std::int64_t(pending.size()) == B) emit(pending, B);
      Batch pool = first;
      while (std::int64_t(pool.size()) < N * B) {
        const auto copy = pool;
        pool.insert(pool.end(), copy.begin(), copy.end());
      }
      Batch buf;
      std::int64_t slot = idx;
      if (std::int64_t(batch.size()) == B)
        ++slot;
      else
        buf = batch;
      std::int64_t cursor = 0;
      while (slot % N != 0 || !buf.empty()) {
        const auto real = std::int64_t(buf.size());
        const std::int64_t take = B - real;
        buf.insert(buf.end(), pool.begin() + cursor, pool.begin() + cursor + take);
        cursor += take;
        if (slot % N == r) emit(buf, real);
        buf.clear();
        ++slot;
      }
    }

    bool advance() {
      fill();
      if (ready.empty()) return false;
      current = std::move(ready.front());
      ready.pop_front();
      return true;
    }
  };

 public:
  using iterator = detail::PassIterator<Pass, ShardBatch>;  //!< a single-pass input iterator

  BatchSamplerShard() = default;
  //! Shards `sampler` (a range of batches of indices) as `opt` says.
  BatchSamplerShard(Sampler sampler, Options opt) : sampler_(std::make_shared<Sampler>(std::move(sampler))), opt_(opt) {
    plan::validate(opt, plan::Loading::sharded, /*varying_ok=*/true);
  }
  //! Starts a new pass over the wrapped sampler.
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Pass>(sampler_, opt_)); }
  //! The end of a pass.
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }
  //! The sharding this shard applies.
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  Options opt_;
};

//! Deduces the sampler's view type (`BatchSamplerShard(batches, spec)`).
template <class S>
BatchSamplerShard(S&&, plan::ShardSpec) -> BatchSamplerShard<std::views::all_t<S>>;

}  // namespace accel::data

// range-v3's customisation point (these ranges are views), not one of accel's names: out of the API reference.
//! \cond
template <class S>
inline constexpr bool ranges::enable_view<accel::data::BatchSamplerShard<S>> = true;
//! \endcond
