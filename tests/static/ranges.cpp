// The range contract of the plan views (STYLE.md, "loader range contract"), checked at compile time.
#include <accel/data/batch_sampler_shard.hpp>
#include <accel/data/iterable_shard.hpp>
#include <accel/pipeline/plan_view.hpp>

#include <range/v3/range/concepts.hpp>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>

#include <ranges>
#include <vector>

namespace {
using namespace accel::data;
using accel::pipeline::PlannedBatch;
using accel::pipeline::PlannedBatches;
using Sampler = std::vector<std::vector<std::int64_t>>;
using Shard = decltype(BatchSamplerShard(std::declval<Sampler>(), accel::plan::ShardSpec{}));
using Iter = decltype(IterableShard(std::views::iota(std::int64_t{0}, std::int64_t{10}), accel::plan::ShardSpec{}));

// PlannedBatches: pure index math, so random access and sized.
static_assert(std::ranges::random_access_range<PlannedBatches> && std::ranges::sized_range<PlannedBatches>);
static_assert(std::ranges::view<PlannedBatches> && ranges::view_<PlannedBatches>);
static_assert(ranges::random_access_range<PlannedBatches> && ranges::sized_range<PlannedBatches>);

// The streaming shards: single-pass input ranges, cheap copyable handles, for std and range-v3 alike.
template <class R>
constexpr bool input_view = std::ranges::input_range<R> && !std::ranges::forward_range<R> && std::ranges::view<R> &&
                            ranges::input_range<R> && ranges::view_<R> && std::copyable<R>;
static_assert(input_view<Shard>);
static_assert(input_view<Iter>);

// Composition with range-v3's take | transform | enumerate and std::views (lvalues and rvalues).
using Piped = decltype(std::declval<Shard&>() | ranges::views::take(2) |
                       ranges::views::transform([](const ShardBatch& b) { return b.real; }) | ranges::views::enumerate);
static_assert(ranges::input_range<Piped>);
using StdPiped = decltype(std::declval<Shard>() | std::views::take(2) |
                          std::views::transform([](const ShardBatch& b) { return b.real; }));
static_assert(std::ranges::input_range<StdPiped>);
using PlanPiped =
    decltype(std::declval<PlannedBatches&>() | ranges::views::take(2) |
             ranges::views::transform([](const PlannedBatch& b) { return b.size(); }) | ranges::views::enumerate);
static_assert(ranges::random_access_range<PlanPiped>);
}  // namespace
