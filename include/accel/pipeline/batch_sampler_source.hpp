#pragma once
//! \file
//! `BatchSamplerSource`, the batch-sampler step source: the epoch of a user's batch sampler (batches of any
//! sizes), sharded as Accelerate's `BatchSamplerShard` (data/batch_sampler_shard.hpp). The sampler is asked once
//! per epoch; every rank shards its batches for every rank, so the last step and every rank's padding rows are
//! known up front. An epoch resumed at another number of processes shards the batches the saving job had not
//! reached (`shard_from`).

#include <accel/data/batch_sampler_shard.hpp>
#include <accel/pipeline/loader_core.hpp>
#include <accel/pipeline/transport.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace accel::pipeline {

template <class Dataset, class Collate, class Config, class Transport>
class BatchSamplerSource {
 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config, Transport>;
  using Batch = typename Core::Batch;
  using Payload = typename Transport::template payload_type<Batch>;
  static_assert(EveryRankReads<Transport, Batch>,
                "accel: BatchSamplerSource shards a user's batch sampler on every rank, each fetching its own batches: "
                "it needs a transport where every rank reads (LocalTransport, loading::sharded)");

  explicit BatchSamplerSource(const std::shared_ptr<Core>& c) : core_(c) {
    auto& k = *core_;
    (void)k.begin_epoch();  // RNG synchronisation, like every epoch
    const auto batches = k.sampler_batches();
    for (int r = 0; r < k.ctx.num_processes; ++r) shards_.push_back(shard(*batches, k.spec(r), k.start));
    for (const auto& rank_batches : shards_) {
      const auto left =
          std::int64_t(rank_batches.size()) - std::min<std::int64_t>(k.skip, std::int64_t(rank_batches.size()));
      steps_ = std::max(steps_, left);
    }
    for (int r = 0; r < int(shards_.size()) && steps_ > 0; ++r)
      if (std::int64_t(shards_[std::size_t(r)].size()) <= k.skip) {
        starved_ = r;
        break;
      }
    const auto& mine = shards_[std::size_t(k.ctx.process_index)];
    first_ = std::min<std::int64_t>(k.skip, std::int64_t(mine.size()));
    k.run_epoch(first_, std::int64_t(mine.size()) - first_);
  }
  [[nodiscard]] std::int64_t count() const noexcept {
    return std::int64_t(shards_[std::size_t(core_->ctx.process_index)].size()) - first_;
  }
  //! Steps of the longest rank (uneven tails: more than `count()` on the ranks that run out first).
  [[nodiscard]] std::int64_t steps() const noexcept { return std::max(steps_, count()); }
  //! What step `q` of the epoch publishes: every rank's rows of its batch at that step (none past its last).
  [[nodiscard]] GradientState::LoaderView view(std::int64_t q) const {
    GatherLayout layout;
    for (const auto& rank_batches : shards_) {
      const std::int64_t j = q + std::min<std::int64_t>(core_->skip, std::int64_t(rank_batches.size()));
      const bool has = j < std::int64_t(rank_batches.size());
      layout.size.push_back(has ? std::int64_t(rank_batches[std::size_t(j)].indices.size()) : 0);
      layout.real.push_back(has ? rank_batches[std::size_t(j)].real : 0);
    }
    return {.end_of_dataloader = q + 1 == count(),
            .batch = q,
            .direct = std::move(layout),
            .steps = steps(),
            .starved = starved_};
  }
  [[nodiscard]] static std::size_t size(Core& k) {
    const auto count = shard(*k.sampler_batches(), k.spec(k.ctx.process_index), k.start).size();
    return count - std::min<std::size_t>(count, std::size_t(k.skip));
  }

  std::optional<detail::Fetched<Payload>> produce(std::int64_t q) const {
    const auto& k = *core_;
    const std::int64_t j = q + first_;
    const auto& mine = shards_[std::size_t(k.ctx.process_index)];
    Batch batch = k.placement()(
        detail::fetch_batch(*k.dataset, k.collate, mine[std::size_t(j)].indices, j, k.epoch, k.ctx.process_index));
    return detail::Fetched<Payload>{std::move(batch), view(q)};
  }

 private:
  static std::vector<data::ShardBatch> shard(const std::vector<std::vector<std::int64_t>>& batches,
                                             const plan::ShardSpec& spec, std::int64_t start) {
    if (start > 0) return shard_from(batches, spec, start);
    std::vector<data::ShardBatch> out;
    for (const auto& b : data::BatchSamplerShard(batches, spec)) out.push_back(b);
    return out;
  }

 public:
  // [accelerate:data_loader.py BatchSamplerShard._iter_with_no_split] (batches of varying size)
  //! Rank `spec.process_index`'s batches of the epoch's user batches from `start` on: batch `start + j*N + r`,
  //! whole rounds only under `drop_last`; an incomplete last round is evened out (`even_batches`) with the epoch's
  //! first round, batch after batch, as `BatchSamplerShard` pads (and as after `skip_first_batches`). With
  //! `start = k * N` these are the shard's batches without its first `k`.
  static std::vector<data::ShardBatch> shard_from(const std::vector<std::vector<std::int64_t>>& batches,
                                                  const plan::ShardSpec& spec, std::int64_t start) {
    const auto L = std::int64_t(batches.size()), N = std::int64_t(spec.num_processes),
               r = std::int64_t(spec.process_index);
    accel::detail::require(start >= 0 && start <= L,
                           "accel: an epoch of " + std::to_string(L) + " sampler batches cannot start at batch " +
                               std::to_string(start) + "; the start must be in [0, " + std::to_string(L) + "]");
    const std::int64_t rest = L - start, rounds = spec.drop_last ? rest / N : (rest + N - 1) / N;
    std::vector<data::ShardBatch> out;
    for (std::int64_t j = 0; j < rounds; ++j) {
      const std::int64_t b = start + j * N + r;
      if (b < L)
        out.push_back({batches[std::size_t(b)], std::int64_t(batches[std::size_t(b)].size())});
      else if (spec.even_batches) {  // padding: the epoch's first round, cycled
        const std::int64_t pool = std::min(N, L), c = b - L;
        out.push_back({batches[std::size_t(c % pool)], 0});
      }
    }
    return out;
  }

 private:
  std::shared_ptr<Core> core_;
  std::vector<std::vector<data::ShardBatch>> shards_;  // every rank's batches of the epoch
  std::int64_t first_ = 0;                             // batches skipped
  std::int64_t steps_ = 0;                             // the longest rank's steps
  int starved_ = -1;                                   // a rank without any batch while others have some
};

}  // namespace accel::pipeline
