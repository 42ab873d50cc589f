#pragma once
//! \file
//! The batch-sampler step source: the epoch of a user's batch sampler (batches of any sizes), sharded as
//! Accelerate's `BatchSamplerShard` (batch_sampler_shard.hpp). The sampler is asked once per epoch; every rank
//! shards its batches for every rank, so the last step and every rank's padding rows are known up front.

#include <accel/data/batch_sampler_shard.hpp>
#include <accel/data/loader_core.hpp>
#include <accel/data/transport.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace accel::data {

template <class Dataset, class Collate, class Config>
class BatchSamplerEpoch {
 public:
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Batch = typename Core::Batch;
  using Payload = Batch;

  explicit BatchSamplerEpoch(const std::shared_ptr<Core>& c) : core_(c) {
    auto& k = *core_;
    (void)k.begin_epoch();  // RNG synchronisation, like every epoch
    const auto batches = k.sampler_batches();
    for (int r = 0; r < k.ctx.num_processes; ++r) shards_.push_back(shard(*batches, k.spec(r)));
    for (const auto& rank_batches : shards_) {
      const auto left = std::int64_t(rank_batches.size()) - std::min<std::int64_t>(k.skip, std::int64_t(rank_batches.size()));
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
    return {.end_of_dataloader = q + 1 == count(), .batch = q, .direct = std::move(layout), .steps = steps(), .starved = starved_};
  }
  [[nodiscard]] static std::size_t size(Core& k) {
    const auto count = shard(*k.sampler_batches(), k.spec(k.ctx.process_index)).size();
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
  static std::vector<ShardBatch> shard(const std::vector<std::vector<std::int64_t>>& batches, const plan::ShardSpec& spec) {
    std::vector<ShardBatch> out;
    for (const auto& b : BatchSamplerShard(batches, spec)) out.push_back(b);
    return out;
  }

  std::shared_ptr<Core> core_;
  std::vector<std::vector<ShardBatch>> shards_;  // every rank's batches of the epoch
  std::int64_t first_ = 0;                        // batches skipped
  std::int64_t steps_ = 0;                        // the longest rank's steps
  int starved_ = -1;                              // a rank without any batch while others have some
};

}  // namespace accel::data
