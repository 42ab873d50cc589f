// Samplers (data/sampler.hpp): seeded shuffles bit-identical to Python Accelerate's, SeedableRandomSampler's epochs,
// explicit sampler seeds, and the user's own samplers and batch samplers through prepared loaders.
#include "../support.hpp"

#include <ATen/Context.h>
#include <accel/data/loader.hpp>
#include <accel/data/sampler.hpp>
#include <catch2/catch.hpp>

using namespace accel_test;
namespace data = accel::data;
using accel::plan::Loading;
using accel::plan::ShardSpec;

TEST_CASE("seeded shuffles are bit-identical to Python Accelerate's", "[plan][shuffle][golden]") {
  const auto file = accel_test::golden("shuffles.json");
  std::size_t checked = 0;
  for (const auto& c : file.at("cases")) {
    const int N = c.at("num_processes");
    const std::int64_t n = c.at("n");
    const bool replacement = c.at("replacement");
    const auto mode = c.at("sampler") == "seedable" ? data::Shuffle::seedable : data::Shuffle::synchronized;
    std::optional<std::uint64_t> data_seed;
    if (!c.at("data_seed").is_null()) data_seed = c.at("data_seed").get<std::uint64_t>();
    data::RandomSamplerOptions opts{.replacement = replacement,
                                    .num_samples = replacement ? std::optional<std::int64_t>(n + 5) : std::nullopt};
    for (const auto& proc : c.at("processes")) {
      const int r = proc.at("process_index");
      // Every rank of a job starts from the job's seed.
      at::manual_seed(c.at("seed").get<std::uint64_t>());
      data::ShuffledOrders orders(n, N, mode, data_seed, opts);
      const ShardSpec spec{.batch_size = c.at("batch_size"),
                           .drop_last = c.at("drop_last"),
                           .num_processes = N,
                           .process_index = r,
                           .split_batches = c.at("split_batches"),
                           .even_batches = c.at("even_batches")};
      const auto& epochs = proc.at("epochs");
      for (std::size_t e = 0; e < epochs.size(); ++e) {
        const auto order = orders.next(static_cast<std::int64_t>(e));
        const auto p = accel::plan::loader_plan(spec, order.size(), Loading::sharded);
        INFO("case " << c.dump().substr(0, 160) << " rank " << r << " epoch " << e);
        REQUIRE(batches_of(p, order) == as_batches(epochs[e]));
        ++checked;
      }
    }
  }
  CHECK(checked > 5000);
}

TEST_CASE("SeedableRandomSampler: epoch e is seeded with initial_seed + e", "[plan][shuffle]") {
  at::manual_seed(5);
  data::SeedableRandomSampler a(50);  // initial seed from the global generator
  data::SeedableRandomSampler b(50, 5);
  CHECK(a.initial_seed() == 5);
  for (std::int64_t e = 0; e < 3; ++e) {
    a.set_epoch(e);
    b.set_epoch(e);
    const auto oa = a.order(), ob = b.order();
    const auto direct = data::RandomSampler(50, data::make_generator(5 + e)).next_epoch();
    for (std::int64_t i = 0; i < 50; ++i) {
      REQUIRE(oa[i] == ob[i]);
      REQUIRE(oa[i] == direct[i]);
    }
  }
  a.set_epoch(0);
  data::SeedableRandomSampler c(50, 6);
  const auto o0 = a.order(), o1 = c.order();
  bool differs = false;
  for (std::int64_t i = 0; i < 50; ++i) differs |= o0[i] != o1[i];
  CHECK(differs);
}

TEST_CASE("an explicit sampler seed fixes the order whatever the global seed", "[loader][shuffle]") {
  auto epoch_of = [](std::uint64_t global, int N) {
    at::manual_seed(global);
    data::DataLoader dl(indices(20), {.batch_size = 20, .shuffle = true, .seed = 77});
    auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{N, 0, nullptr});
    return run_epoch(l).first;
  };
  CHECK(epoch_of(1, 1) == epoch_of(2, 1));
  CHECK(epoch_of(1, 2) == epoch_of(3, 2));
  const auto direct = data::RandomSampler(20, data::make_generator(77)).next_epoch();
  CHECK(epoch_of(9, 1).front().front() == direct[0]);  // the generator PyTorch's DataLoader(generator=g) would use
}

TEST_CASE("samplers and batch samplers of the user's", "[loader][sampler]") {
  // A sampler: any order, any length (here a subset, reversed, different every epoch).
  data::DataLoaderOptions opt{.batch_size = 2};
  opt.sampler = [](std::int64_t epoch) {
    std::vector<std::int64_t> v;
    for (std::int64_t i = 9; i >= 0; i -= 2) v.push_back(i - epoch);
    return v;
  };
  auto sampled =
      data::prepare_data_loader<Even>(data::DataLoader(indices(10), opt), data::PrepareContext{2, 0, nullptr});
  CHECK((run_epoch(sampled).first == Batches{{9, 7}, {1, 9}}));  // rank 0 of 2: batches 0 and 2; the tail padded
  CHECK((run_epoch(sampled).first == Batches{{8, 6}, {0, 8}}));  // epoch 1
  // A batch sampler with varying batch sizes: Accelerate's own expectations, through the loader.
  const auto file = accel_test::golden("accelerate_tests_expectations.json");
  int checked = 0;
  for (const auto& e : file.at("entries")) {
    if (e.at("kind") != "batch_sampler_shard_varying") continue;
    const auto in = e.at("batches_in").get<Batches>();
    std::int64_t n = 0;
    for (const auto& b : in)
      for (auto i : b) n = std::max(n, i + 1);
    data::DataLoaderOptions bo{.drop_last = e.at("drop_last")};
    bo.batch_sampler = [in](std::int64_t) { return in; };
    const int N = e.at("num_processes");
    for (int r = 0; r < N; ++r) {
      const bool found =
          with_config<ShardedMatrix>(false, e.at("even_batches").get<bool>(), false, [&]<class Config>() {
            auto l = data::prepare_data_loader<Config>(data::DataLoader(indices(n), bo),
                                                       data::PrepareContext{N, r, nullptr});
            CHECK(l.size() == e.at("expected")[std::size_t(r)].size());
            auto [got, ends] = run_epoch(l);
            INFO(e.at("source").get<std::string>() << " rank " << r);
            CHECK(got == e.at("expected")[std::size_t(r)].get<Batches>());
            if (!ends.empty()) CHECK(ends.back());
          });
      REQUIRE(found);
    }
    ++checked;
  }
  CHECK(checked == 8);
  data::DataLoaderOptions both{.batch_size = 2};
  both.sampler = [](std::int64_t) { return std::vector<std::int64_t>{0}; };
  both.batch_sampler = [](std::int64_t) { return Batches{{0}}; };
  CHECK_THROWS_WITH(data::prepare_data_loader<Even>(data::DataLoader(indices(4), both), data::PrepareContext{}),
                    Catch::Contains("give a sampler or a batch_sampler, not both"));
  data::DataLoaderOptions split{.batch_size = 2};
  split.batch_sampler = [](std::int64_t) { return Batches{{0, 1}}; };
  CHECK_THROWS_WITH(
      data::prepare_data_loader<Split>(data::DataLoader(indices(4), split), data::PrepareContext{2, 0, nullptr}),
      Catch::Contains("batches::split needs a fixed batch size"));
  data::DataLoaderOptions bad{.batch_size = 2};
  bad.sampler = [](std::int64_t) { return std::vector<std::int64_t>{0, 7}; };
  auto lb = data::prepare_data_loader<Even>(data::DataLoader(indices(4), bad), data::PrepareContext{});
  CHECK_THROWS_WITH(run_epoch(lb), Catch::Contains("returned index 7, outside the dataset's 4 samples"));
}
