// Sharding plans (plan/plan.hpp): Accelerate's own test expectations, properties on a randomised grid (nothing lost
// or duplicated, equal lengths where Accelerate has them), skipping, errors, range composition.
#include "../support.hpp"

#include <accel/data/batch_sampler_shard.hpp>
#include <accel/pipeline/plan_view.hpp>
#include <accel/plan/plan.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <ranges>

using namespace accel_test;
namespace data = accel::data;
using accel::plan::Loading;
using accel::plan::ShardSpec;

TEST_CASE("Accelerate's own test expectations", "[plan][golden]") {
  const auto file = accel_test::golden("accelerate_tests_expectations.json");
  std::map<std::string, int> seen;
  for (const auto& e : file.at("entries")) {
    const std::string kind = e.at("kind");
    INFO(e.at("source").get<std::string>());
    if (kind == "batch_sampler_shard") {
      const auto& expected = e.at("expected");
      for (int r = 0; r < int(expected.size()); ++r) {
        const ShardSpec s{.batch_size = e.at("batch_size"),
                          .drop_last = e.at("drop_last"),
                          .num_processes = e.at("num_processes"),
                          .process_index = r,
                          .split_batches = e.at("split_batches"),
                          .even_batches = e.at("even_batches")};
        const auto p = accel::plan::shard_plan(s, e.at("n"));
        CHECK(batches_of(p) == as_batches(expected[r]));
        if (e.value("len_checked", false)) CHECK(p.size() == std::int64_t(expected[r].size()));
      }
    } else if (kind == "batch_sampler_shard_varying") {
      const auto in = as_batches(e.at("batches_in"));
      const auto& expected = e.at("expected");
      for (int r = 0; r < int(expected.size()); ++r) {
        data::BatchSamplerShard shard(in, {.batch_size = accel::plan::varying,
                                           .drop_last = e.at("drop_last"),
                                           .num_processes = e.at("num_processes"),
                                           .process_index = r,
                                           .even_batches = e.at("even_batches")});
        Batches got;
        for (const auto& b : shard) got.push_back(b.indices);
        CHECK(got == as_batches(expected[r]));
      }
    } else if (kind == "batch_sampler_shard_error") {
      if (e.contains("batches_in")) {
        CHECK_THROWS_WITH(
            (data::BatchSamplerShard(
                as_batches(e.at("batches_in")),
                {.batch_size = accel::plan::varying, .num_processes = e.at("num_processes"), .split_batches = true})),
            Catch::Contains("batches::split needs a batch sampler with a fixed batch_size"));
      } else {
        CHECK_THROWS_WITH(
            accel::plan::shard_plan(
                {.batch_size = e.at("batch_size"), .num_processes = e.at("num_processes"), .split_batches = true},
                e.at("n")),
            Catch::Contains("must be a round multiple of the number of processes"));
      }
    } else if (kind == "skip_batch_sampler" || kind == "skip_data_loader" || kind == "skip_first_batches") {
      const auto p =
          accel::plan::batch_plan(e.at("batch_size"), e.at("drop_last"), e.at("n")).skip(e.at("num_batches"));
      CHECK(batches_of(p) == as_batches(e.at("expected")));
    } else if (kind == "end_of_dataloader_shard" || kind == "end_of_dataloader_dispatcher") {
      const auto p =
          accel::plan::loader_plan({.batch_size = e.at("batch_size")}, e.at("n"),
                                   kind == "end_of_dataloader_shard" ? Loading::sharded : Loading::dispatched);
      std::vector<bool> flags;
      for (std::int64_t j = 0; j < p.size(); ++j) flags.push_back(p.end_of_dataloader(j));
      CHECK(flags == e.at("expected_end_of_dataloader").get<std::vector<bool>>());
    } else if (kind == "batch_sizes_2proc") {
      for (int r = 0; r < 2; ++r) {
        const auto p = accel::plan::loader_plan({.batch_size = e.at("batch_size"),
                                                 .num_processes = 2,
                                                 .process_index = r,
                                                 .even_batches = e.at("even_batches")},
                                                e.at("n"), Loading::sharded);
        std::vector<std::int64_t> sizes;
        for (std::int64_t j = 0; j < p.size(); ++j) sizes.push_back(p.span(j).size());
        CHECK(sizes == e.at("expected_batch_sizes")[r].get<std::vector<std::int64_t>>());
      }
    } else if (kind == "iterable_property") {
      // Checked on the randomised grid below ("iterable shards interleave back into the stream").
    } else {
      FAIL("unknown expectation kind " << kind);
    }
    ++seen[kind];
  }
  CHECK(seen.at("batch_sampler_shard") == 36);
  CHECK(seen.at("batch_sampler_shard_varying") == 8);
}

TEST_CASE("plan properties on a randomised grid (n up to 1e5, up to 64 processes)", "[plan][property]") {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    auto s = random_spec(rng, /*small=*/false);
    const std::int64_t n = trial % 10 == 0 ? std::int64_t(rng() % 40) : std::int64_t(rng() % 100001);
    for (const auto loading : {Loading::sharded, Loading::iterable, Loading::dispatched}) {
      if (loading != Loading::sharded && s.split_batches && s.batch_size == 1) continue;
      std::vector<std::int64_t> seen(std::size_t(n), 0);
      std::int64_t first_size = -1;
      bool sizes_equal = true;
      std::int64_t dropped_tail = 0;
      for (int r = 0; r < s.num_processes; ++r) {
        s.process_index = r;
        const auto p = accel::plan::loader_plan(s, n, loading);
        if (first_size < 0) first_size = p.size();
        sizes_equal &= p.size() == first_size;
        std::int64_t yielded = 0;
        for (std::int64_t j = 0; j < p.size(); ++j, ++yielded) {
          const auto span = p.span(j);
          const auto real = p.real(j);
          REQUIRE(p.end_of_dataloader(j) == (j + 1 == p.size()));
          for (auto pos = span.begin; pos < span.end; ++pos) {
            const auto idx = p.sample(pos);
            REQUIRE(idx >= 0);
            REQUIRE(idx < n);
            // Real samples come first; a duplicate is always marked as padding.
            if (pos - span.begin < real) ++seen[std::size_t(idx)];
          }
        }
        REQUIRE(yielded == p.size());
      }
      INFO("n=" << n << " B=" << s.batch_size << " N=" << s.num_processes << " split=" << s.split_batches
                << " even=" << s.even_batches << " drop_last=" << s.drop_last << " loading=" << int(loading));
      // No sample is ever real twice: duplicates appear only where the plan marks padding.
      for (auto k : seen) REQUIRE(k <= 1);
      if (!s.drop_last) {
        // Without drop_last nothing is lost: the union of the shards covers the dataset...
        for (auto k : seen) REQUIRE(k == 1);
      } else {
        // ...with drop_last only the tail that does not fill a round is dropped.
        for (auto k : seen) dropped_tail += 1 - k;
        const std::int64_t round = s.split_batches ? s.batch_size : s.batch_size * s.num_processes;
        REQUIRE(dropped_tail <
                round + (loading == Loading::sharded && !s.split_batches ? s.batch_size * s.num_processes : 0));
      }
      // Even tails (and every dispatched / iterable epoch) give every process the same number of batches.
      if (s.even_batches || loading != Loading::sharded || s.num_processes == 1 || s.drop_last) {
        if (!(loading == Loading::sharded && s.split_batches && !s.even_batches)) REQUIRE(sizes_equal);
      }
    }
  }
}

TEST_CASE("an empty dataset yields nothing on every path", "[plan]") {
  for (const auto loading : {Loading::sharded, Loading::iterable, Loading::dispatched})
    for (int N : {1, 2, 3})
      for (bool split : {false, true}) {
        const auto p = accel::plan::loader_plan(
            {.batch_size = 6, .num_processes = N, .process_index = N - 1, .split_batches = split}, 0, loading);
        CHECK(p.size() == 0);
        CHECK(p.empty());
      }
}

TEST_CASE("skipping counts batches of the prepared loader and keeps the padding marks", "[plan][skip]") {
  // n=10, B=3, N=2, rank 1: [3,4,5] [9,0*,1*]; skipping 1 keeps the padding of the last batch (Q8 fixed).
  const auto p =
      accel::plan::loader_plan({.batch_size = 3, .num_processes = 2, .process_index = 1}, 10, Loading::sharded);
  const auto skipped = p.skip(1);
  REQUIRE(skipped.size() == 1);
  CHECK(batches_of(skipped) == Batches{{9, 0, 1}});
  CHECK(skipped.real(0) == 1);
  CHECK(skipped.end_of_dataloader(0));
  CHECK(p.skip(5).size() == 0);
  CHECK(p.skip(0) == p);
  // Dispatched: a skip is a step of the prepared loader, not 1/N of one (Q9 fixed).
  const auto d =
      accel::plan::loader_plan({.batch_size = 3, .num_processes = 2, .process_index = 0}, 10, Loading::dispatched);
  CHECK(batches_of(d) == Batches{{0, 1, 2}, {6, 7}});
  CHECK(batches_of(d.skip(1)) == Batches{{6, 7}});
}

TEST_CASE("bad parameters are clear errors", "[plan][errors]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(
      accel::plan::shard_plan({.batch_size = 3, .num_processes = 2, .split_batches = true}, 10),
      Contains("under batches::split the batch size (3) must be a round multiple of the number of processes (2)"));
  CHECK_THROWS_WITH(accel::plan::shard_plan({.batch_size = 1, .num_processes = 2, .split_batches = true}, 10),
                    Contains("round multiple"));
  CHECK_THROWS_WITH(accel::plan::dispatch_plan({.batch_size = 3, .num_processes = 2, .split_batches = true}, 10),
                    Contains("round multiple"));
  CHECK_THROWS_WITH(accel::plan::shard_plan({.batch_size = 3, .num_processes = 0}, 10),
                    Contains("num_processes must be at least 1 (got 0)"));
  CHECK_THROWS_WITH(accel::plan::shard_plan({.batch_size = 3, .num_processes = 2, .process_index = 2}, 10),
                    Contains("process_index 2 is out of range for 2 processes"));
  CHECK_THROWS_WITH(accel::plan::shard_plan({.batch_size = 3, .num_processes = 2, .process_index = -1}, 10),
                    Contains("process_index -1 is out of range"));
  CHECK_THROWS_WITH(accel::plan::shard_plan({.batch_size = 0}, 10), Contains("batch_size must be at least 1 (got 0)"));
  CHECK_THROWS_WITH(accel::plan::batch_plan(2, false, -1), Contains("dataset length is negative"));
  CHECK_THROWS_WITH(accel::plan::batch_plan(2, false, 10).skip(-1),
                    Contains("cannot skip a negative number of batches (-1)"));
  CHECK_THROWS_WITH(
      accel::pipeline::planned_batches(accel::plan::batch_plan(2, false, 10), data::IndexOrder::sequential(5)),
      Contains("the plan covers 10 samples but the order has only 5"));
  CHECK_THROWS_AS(accel::plan::shard_plan({.batch_size = 3, .num_processes = 0}, 10), accel::InvalidArgument);
}

TEST_CASE("planned batches compose with std::views and range-v3", "[plan][ranges]") {
  const auto view = accel::pipeline::planned_batches(
      accel::plan::shard_plan({.batch_size = 3, .num_processes = 3, .process_index = 0}, 10),
      data::IndexOrder::sequential(10));
  STATIC_REQUIRE(std::ranges::random_access_range<decltype(view)>);
  CHECK(view.size() == 2);
  std::vector<std::int64_t> reals;
  for (const auto& b : view | std::views::take(5)) reals.push_back(b.real());
  CHECK(reals == std::vector<std::int64_t>{3, 1});
  std::vector<std::pair<std::size_t, std::int64_t>> firsts;
  for (auto [i, first] : view | ranges::views::take(5) |
                             ranges::views::transform([](const accel::pipeline::PlannedBatch& b) { return b[0]; }) |
                             ranges::views::enumerate)
    firsts.emplace_back(i, first);
  CHECK(firsts == std::vector<std::pair<std::size_t, std::int64_t>>{{0, 0}, {1, 9}});
  std::vector<std::int64_t> last;
  for (auto x : view[1].indices()) last.push_back(x);
  CHECK(last == std::vector<std::int64_t>{9, 0, 1});
  CHECK(view[1].padding() == 2);
}
