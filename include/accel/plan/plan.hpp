#pragma once
//! \file
//! Sharding plans: which positions of an epoch each process gets, batch by batch, as pure index math.
//!
//! A plan needs no communicator: every rank, every test and `accel-plan` compute the same answer. Data
//! flows plan -> transport -> placement; this file is the first step only.
//!
//! ## The padded stream
//! Every fixed-batch-size path of Accelerate (BatchSamplerShard, IterableDatasetShard, the dispatcher, and
//! each of them after skipping) hands out *contiguous runs of one stream of positions*. Positions
//! `0 .. n-1` are the epoch's samples in sampling order; positions `>= n` are padding that repeats the
//! start of the epoch: position `p >= n` is sample `(p - n) % wrap`, where `wrap` is the size of the pool
//! Accelerate pads from (the first round of batches, the first chunk, or the first `N` samples of the
//! first global batch). So a batch is `[begin, end)`; its real samples are the positions below `n` and
//! always come first; the rest are the padding duplicates that `gather_for_metrics` must drop.
//!
//! | function            | Accelerate                                                      |
//! |---------------------|-----------------------------------------------------------------|
//! | `batch_plan`        | `BatchSampler(sampler, batch_size, drop_last)` (no sharding)    |
//! | `shard_plan`        | `BatchSamplerShard` over that batch sampler                      |
//! | `iterable_plan`     | `IterableDatasetShard` + the per-process `DataLoader` batching  |
//! | `dispatch_plan`     | `DataLoaderDispatcher` (what each rank keeps of rank 0's batch) |
//! | `loader_plan`       | what `prepare_data_loader` yields on one process                |
//! | `BatchPlan::skip`   | `SkipBatchSampler` / `skip_first_batches`                       |
//!
//! ## Starting inside the epoch
//! Every plan function takes a `start`: the plan of the epoch's positions `start .. n-1` only, batch 0 beginning at
//! `start` (a job resumed at another number of processes: the first `start` samples were consumed by the job that
//! saved the checkpoint, README "Resuming at another world size"). Padding still repeats the start of the epoch,
//! as after `skip_first_batches`; with `start = k * per_step(spec)` the plan is exactly `plan(spec, n).skip(k)`.
//!
//! Deliberate differences (README, "Differences from Accelerate"): `size()` is always the number of batches
//! really yielded (Accelerate's `len` overstates in split mode, Q4/Q5, and goes negative after skipping too
//! far); an empty epoch yields nothing on every path (the dispatcher raises); padding stays known after
//! skipping (Q8).

#include <accel/error.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

//! Sharding plans: the index arithmetic of Accelerate's samplers, shards and dispatcher, closed-form (what `accel-plan`
//! prints).
namespace accel::plan {

//! How one process takes part in an epoch: the data-loading half of an `Accelerator`'s configuration plus the
//! user's `DataLoader` settings. The one vocabulary of every sharding path: the closed-form plans below, the
//! streaming `data::BatchSamplerShard` and `data::IterableShard`, and the prepared loaders.
struct ShardSpec {
  std::int64_t batch_size =
      1;                   //!< the user's `batch_size` (global under `split_batches`); `varying` for a batch sampler's
  bool drop_last = false;  //!< the user's `drop_last`
  int num_processes = 1;   //!< N, the processes of the job
  int process_index = 0;   //!< this process's rank
  bool split_batches = false;  //!< Accelerate's `split_batches`
  bool even_batches = true;    //!< Accelerate's `even_batches`
};

//! `ShardSpec::batch_size` of a batch sampler whose batches vary in size (`data::BatchSamplerShard` only).
inline constexpr std::int64_t varying = 0;

//! Samples of one global batch that each process receives: `batch_size / N` under `split_batches`, else `batch_size`.
[[nodiscard]] constexpr std::int64_t per_process(const ShardSpec& s) noexcept {
  return s.split_batches ? s.batch_size / s.num_processes : s.batch_size;
}

//! Samples of one global batch, across every process (Accelerate's `total_batch_size`, and the chunk an iterable
//! shard and the dispatcher read per step): `batch_size` under `split_batches`, else `batch_size * N`.
[[nodiscard]] constexpr std::int64_t per_step(const ShardSpec& s) noexcept {
  return s.split_batches ? s.batch_size : s.batch_size * s.num_processes;
}

//! Stream positions `[begin, end)` of one batch.
struct Span {
  std::int64_t begin = 0;  //!< the first position
  std::int64_t end = 0;    //!< past the last position
  //! The number of positions.
  [[nodiscard]] constexpr std::int64_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(Span, Span) = default;
};

//! The batches one process yields in one epoch: `size()` batches, batch `j` covering `span(j)`.
//! O(1) memory, O(1) per batch; copying is cheap.
class BatchPlan {
 public:
  constexpr BatchPlan() = default;

  //! Number of batches this process yields.
  [[nodiscard]] constexpr std::int64_t size() const noexcept { return count_; }
  //! Whether the process yields no batch.
  [[nodiscard]] constexpr bool empty() const noexcept { return count_ == 0; }
  //! Number of real samples in the epoch (positions below this are real).
  [[nodiscard]] constexpr std::int64_t samples() const noexcept { return n_; }

  //! Stream positions of batch `j` (0 <= j < size()).
  [[nodiscard]] constexpr Span span(std::int64_t j) const noexcept {
    const std::int64_t k = j + skipped_;
    if (k == total_ - 1 && has_last_) return last_;
    const std::int64_t begin = k * stride_ + offset_;
    return {std::min(begin, limit_), std::min(begin + width_, limit_)};
  }
  //! The sample (position in the epoch's order, `0 .. samples()-1`) at stream position `pos`.
  [[nodiscard]] constexpr std::int64_t sample(std::int64_t pos) const noexcept {
    return pos < n_ ? pos : (pos - n_) % wrap_;
  }
  //! How many leading entries of batch `j` are real samples; the others are padding duplicates.
  [[nodiscard]] constexpr std::int64_t real(std::int64_t j) const noexcept {
    const Span s = span(j);
    return std::clamp<std::int64_t>(n_ - s.begin, 0, s.size());
  }
  //! Accelerate's `end_of_dataloader`: true exactly on the last batch.
  [[nodiscard]] constexpr bool end_of_dataloader(std::int64_t j) const noexcept { return j + 1 == count_; }

  //! The plan without its first `k` batches (`SkipBatchSampler(k)`); padding marks are kept.
  [[nodiscard]] BatchPlan skip(std::int64_t k) const {
    detail::require(k >= 0, "accel: cannot skip a negative number of batches (" + std::to_string(k) +
                                "); pass the number of batches already consumed, 0 or more");
    BatchPlan p = *this;
    const std::int64_t dropped = std::min(k, count_);
    p.skipped_ += dropped;
    p.count_ -= dropped;
    return p;
  }
  //! Batches skipped from the front (`skip`).
  [[nodiscard]] constexpr std::int64_t skipped() const noexcept { return skipped_; }

  friend constexpr bool operator==(const BatchPlan&, const BatchPlan&) = default;

  //! Batches `j` at `j * stride + offset`, `width` wide, clipped to `limit`; the last one may be overridden.
  struct Layout {
    //!@{
    //! The layout's parameters: real samples, the wrap-around modulus, the batch count, stride, offset, width, limit.
    std::int64_t samples, wrap, count, stride, offset, width, limit;
    //!@}
  };
  //! A plan of `l`'s affine batches.
  static constexpr BatchPlan affine(Layout l) noexcept {
    BatchPlan p;
    p.n_ = l.samples;
    p.wrap_ = std::max<std::int64_t>(l.wrap, 1);
    p.count_ = p.total_ = l.count;
    p.stride_ = l.stride;
    p.offset_ = l.offset;
    p.width_ = l.width;
    p.limit_ = l.limit;
    return p;
  }
  //! The same plan with its last batch covering `last` instead.
  constexpr BatchPlan with_last(Span last) const noexcept {
    BatchPlan p = *this;
    p.has_last_ = true;
    p.last_ = last;
    return p;
  }

 private:
  std::int64_t n_ = 0, wrap_ = 1, count_ = 0, total_ = 0, skipped_ = 0;
  std::int64_t stride_ = 0, offset_ = 0, width_ = 0, limit_ = 0;
  bool has_last_ = false;
  Span last_{};
};

//! Which loading path a spec is used for (their checks differ in one place: see `validate`).
enum class Loading { sharded, iterable, dispatched };

// [accelerate:data_loader.py BatchSamplerShard.__init__, IterableDatasetShard.__init__, prepare_data_loader]
//! The one validation of a spec, for every path: a batch size of at least 1 (or `varying`, where the caller shards
//! a batch sampler of varying sizes, `varying_ok`; never under `split_batches`), at least one process, a process index
//! in range, and under `split_batches` a batch size that is a round multiple of the processes (Accelerate lets a batch
//! size of 1 through on the iterable and dispatched paths, where it then yields nothing; `prepare_data_loader`
//! refuses it).
inline void validate(const ShardSpec& s, Loading path = Loading::sharded, bool varying_ok = false) {
  using accel::detail::require;
  require(s.batch_size >= 1 || (varying_ok && s.batch_size == varying),
          "accel: batch_size must be at least 1 (got " + std::to_string(s.batch_size) + ")");
  require(s.num_processes >= 1, "accel: num_processes must be at least 1 (got " + std::to_string(s.num_processes) +
                                    "); check WORLD_SIZE or the launcher's --nproc-per-node");
  require(s.process_index >= 0 && s.process_index < s.num_processes,
          "accel: process_index " + std::to_string(s.process_index) + " is out of range for " +
              std::to_string(s.num_processes) + " processes; it must be in [0, " + std::to_string(s.num_processes) +
              ")");
  if (!s.split_batches) return;
  require(s.batch_size != varying,
          "accel: batches::split needs a batch sampler with a fixed batch_size; use "
          "batches::per_process for batches of varying size");
  if (s.batch_size % s.num_processes == 0 || (path != Loading::sharded && s.batch_size == 1)) return;
  require(false, "accel: under batches::split the batch size (" + std::to_string(s.batch_size) +
                     ") must be a round multiple of the number of processes (" + std::to_string(s.num_processes) +
                     "); use a batch size divisible by it, or batches::per_process");
}

//! `validate`, plus a dataset length of 0 or more.
inline void validate(const ShardSpec& s, std::int64_t n, Loading path) {
  accel::detail::require(n >= 0, "accel: the dataset length is negative (" + std::to_string(n) + ")");
  validate(s, path);
}

// [accelerate:data_loader.py DataLoaderDispatcher._fetch_batches]
//! How the dispatcher cuts one global batch of `observed` samples between `N` processes: rank r keeps
//! `[min(r*per, total), min((r+1)*per, total))` of it. On the epoch's last step, when `observed` is not a multiple
//! of N and `drop_last` is off, the first `first` samples of the epoch are appended and `per` grows by one, so the
//! slices are re-cut evenly and may be short or empty. Map-style (`dispatch_plan`) and streamed dispatching
//! (the stream loader, which learns `observed` as it reads) share this rule.
struct DispatchCut {
  std::int64_t per = 0;       //!< samples per rank
  std::int64_t total = 0;     //!< samples of the step, appended padding included
  std::int64_t observed = 0;  //!< real samples of the step
  //! Rank `r`'s part of the step.
  [[nodiscard]] constexpr Span slice(int r) const noexcept {
    const std::int64_t b = std::min(r * per, total);
    return {b, std::min(b + per, total)};
  }
  //! How many leading entries of rank r's slice are real samples.
  [[nodiscard]] constexpr std::int64_t real(int r) const noexcept {
    return std::clamp<std::int64_t>(observed - r * per, 0, slice(r).size());
  }
};
//! The cut of a step of `observed` samples between `N` ranks (`last`: the epoch's last step; `first`: samples the epoch
//! starts with, for the padding).
[[nodiscard]] constexpr DispatchCut dispatch_cut(std::int64_t observed, int N, bool last, bool drop_last,
                                                 std::int64_t first) noexcept {
  const bool pad = last && !drop_last && observed % N != 0;
  return {observed / N + (pad ? 1 : 0), observed + (pad ? first : 0), observed};
}

namespace detail {

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept { return (a + b - 1) / b; }
constexpr std::int64_t unbounded = INT64_MAX / 4;
//! `start`, checked to lie within the epoch's `n` samples.
inline std::int64_t checked_start(std::int64_t start, std::int64_t n) {
  accel::detail::require(start >= 0 && start <= n, "accel: an epoch of " + std::to_string(n) +
                                                       " samples cannot start at position " + std::to_string(start) +
                                                       "; the start must be in [0, " + std::to_string(n) + "]");
  return start;
}

}  // namespace detail

//! `BatchSampler(order, batch_size, drop_last)`: the user's loader on one process, no padding.
inline BatchPlan batch_plan(std::int64_t batch_size, bool drop_last, std::int64_t n, std::int64_t start = 0) {
  validate({.batch_size = batch_size, .drop_last = drop_last}, n, Loading::iterable);
  const std::int64_t rest = n - detail::checked_start(start, n);
  const std::int64_t count = drop_last ? rest / batch_size : detail::ceil_div(rest, batch_size);
  return BatchPlan::affine({.samples = n,
                            .wrap = 1,
                            .count = count,
                            .stride = batch_size,
                            .offset = start,
                            .width = batch_size,
                            .limit = n});
}

// [accelerate:data_loader.py BatchSamplerShard._iter_with_no_split / _iter_with_split]
//! `BatchSamplerShard(BatchSampler(order, B, drop_last), N, r, split, even)`. Pads even with one process,
//! exactly like Accelerate's class (the prepared loader does not shard at all then: see `loader_plan`).
inline BatchPlan shard_plan(const ShardSpec& s, std::int64_t n, std::int64_t start = 0) {
  validate(s, n, Loading::sharded);
  const std::int64_t B = s.batch_size, N = s.num_processes, r = s.process_index;
  const std::int64_t rest = n - detail::checked_start(start, n);
  const std::int64_t L = s.drop_last ? rest / B : detail::ceil_div(rest, B);  // batches of the user's sampler
  const std::int64_t full = rest / B;
  const bool short_last = !s.drop_last && rest % B != 0;
  if (!s.split_batches) {
    // Batch j of this process is the user's batch j*N + r; an even tail keeps going past the data, with the
    // padding cursor running on over the first round of batches (`wrap` = min(n, N*B)).
    std::int64_t count = 0;
    if (s.drop_last)
      count = L / N;
    else if (s.even_batches)
      count = detail::ceil_div(L, N);
    else
      count = L / N + (r < L % N ? 1 : 0);
    const bool padded = !s.drop_last && s.even_batches;
    return BatchPlan::affine({.samples = n,
                              .wrap = std::min(n, N * B),
                              .count = count,
                              .stride = N * B,
                              .offset = start + r * B,
                              .width = B,
                              .limit = padded ? detail::unbounded : n});
  }
  // Split: every user batch of exactly B samples is cut into N slices of B/N; a short last batch is
  // completed from the first batch (even) or cut as it is (uneven: ranks past its end get nothing).
  const std::int64_t per = B / N;
  std::int64_t count = full;
  if (short_last) {
    if (s.even_batches)
      count += 1;
    else if (rest % B > r * per)
      count += 1;
  }
  return BatchPlan::affine({.samples = n,
                            .wrap = std::min(n, B),
                            .count = count,
                            .stride = B,
                            .offset = start + r * per,
                            .width = per,
                            .limit = s.even_batches ? detail::unbounded : n});
}

// [accelerate:data_loader.py IterableDatasetShard.__iter__]
//! `IterableDatasetShard` followed by the per-process `DataLoader` that batches its samples: chunks of
//! `R = B` (split) or `B*N` samples, this process owning `B/N` (split) or `B` consecutive ones of each.
//! The last chunk is completed by repeating the first chunk (`wrap` = min(n, R)) unless `drop_last`.
//! Like Accelerate, split with `batch_size == 1` and several processes yields nothing; `prepare()`
//! refuses that configuration before it gets here.
inline BatchPlan iterable_plan(const ShardSpec& s, std::int64_t n, std::int64_t start = 0) {
  validate(s, n, Loading::iterable);
  const std::int64_t r = s.process_index;
  const std::int64_t chunk = per_step(s);
  const std::int64_t per = per_process(s);
  const std::int64_t rest = n - detail::checked_start(start, n);
  const std::int64_t chunks = s.drop_last ? rest / chunk : detail::ceil_div(rest, chunk);
  return BatchPlan::affine({.samples = n,
                            .wrap = std::min(n, chunk),
                            .count = per > 0 ? chunks : 0,
                            .stride = chunk,
                            .offset = start + r * per,
                            .width = per,
                            .limit = detail::unbounded});
}

// [accelerate:data_loader.py DataLoaderDispatcher._fetch_batches / __iter__]
//! What rank r keeps of each global batch that rank 0 reads and sends. A global batch is N user batches
//! (one under split); each rank keeps the slice `[r*per, (r+1)*per)` with `per = observed / N`. The last
//! global batch, when its size is not a multiple of N and `drop_last` is off, gets the first N samples of the
//! epoch appended and `per + 1` (so slices are re-cut evenly and may be short or empty).
inline BatchPlan dispatch_plan(const ShardSpec& s, std::int64_t n, std::int64_t start = 0) {
  validate(s, n, Loading::dispatched);
  const std::int64_t B = s.batch_size, N = s.num_processes, r = s.process_index;
  const std::int64_t rest = n - detail::checked_start(start, n);
  const std::int64_t inner = s.drop_last ? rest / B : detail::ceil_div(rest, B);
  const std::int64_t global = per_step(s);
  std::int64_t steps = inner;
  if (!s.split_batches) steps = s.drop_last ? inner / N : detail::ceil_div(inner, N);
  if (steps == 0) return {};
  const std::int64_t first = std::min({N, global, n});  // the padding Accelerate appends
  const std::int64_t per = global / N;
  const BatchPlan full = BatchPlan::affine({.samples = n,
                                            .wrap = first,
                                            .count = steps,
                                            .stride = global,
                                            .offset = start + r * per,
                                            .width = per,
                                            .limit = detail::unbounded});
  const std::int64_t last = start + (steps - 1) * global;
  const auto cut = dispatch_cut(std::min(global, n - last), int(N), /*last=*/true, s.drop_last, first);
  const Span mine = cut.slice(int(r));
  return full.with_last({last + mine.begin, last + mine.end});
}

//! What `prepare_data_loader` yields on one process for a loader of `n` samples (map-style: sharded;
//! an iterable dataset: iterable; `loading::dispatched`: dispatched). One process is not sharded at all.
inline BatchPlan loader_plan(const ShardSpec& s, std::int64_t n, Loading loading, std::int64_t start = 0) {
  validate(s, n, loading);
  switch (loading) {
    case Loading::dispatched:
      return dispatch_plan(s, n, start);
    case Loading::iterable:
      if (s.num_processes == 1) return batch_plan(s.batch_size, s.drop_last, n, start);
      return iterable_plan(s, n, start);
    case Loading::sharded:
      if (s.num_processes == 1) return batch_plan(s.batch_size, s.drop_last, n, start);
      return shard_plan(s, n, start);
  }
  return {};
}

}  // namespace accel::plan
