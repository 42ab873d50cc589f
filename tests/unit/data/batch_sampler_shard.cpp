// BatchSamplerShard (data/batch_sampler_shard.hpp), Accelerate's streaming algorithm, equals the closed-form plan.
#include "../support.hpp"

#include <accel/data/batch_sampler_shard.hpp>
#include <accel/plan/plan.hpp>
#include <catch2/catch.hpp>

using namespace accel_test;
namespace data = accel::data;
using accel::plan::ShardSpec;

TEST_CASE("the closed-form shard plan equals Accelerate's streaming algorithm", "[plan][property]") {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 1500; ++trial) {
    ShardSpec s = random_spec(rng, /*small=*/true);
    const std::int64_t n = std::int64_t(rng() % 60);
    Batches base;
    for (const auto& b : accel::pipeline::planned_batches(accel::plan::batch_plan(s.batch_size, s.drop_last, n),
                                                          data::IndexOrder::sequential(n))) {
      std::vector<std::int64_t> v;
      b.indices_into(v);
      base.push_back(v);
    }
    for (int r = 0; r < s.num_processes; ++r) {
      s.process_index = r;
      const auto closed = yield_of(accel::plan::shard_plan(s, n));
      data::BatchSamplerShard shard(base, {.batch_size = s.batch_size,
                                           .drop_last = s.drop_last,
                                           .num_processes = s.num_processes,
                                           .process_index = r,
                                           .split_batches = s.split_batches,
                                           .even_batches = s.even_batches});
      Batches got;
      std::vector<std::int64_t> real;
      for (const auto& b : shard) {
        got.push_back(b.indices);
        real.push_back(b.real);
      }
      INFO("n=" << n << " B=" << s.batch_size << " N=" << s.num_processes << " r=" << r << " split=" << s.split_batches
                << " even=" << s.even_batches << " drop_last=" << s.drop_last);
      REQUIRE(got == closed.batches);
      REQUIRE(real == closed.real);
    }
  }
}
