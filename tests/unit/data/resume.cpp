// Resuming a loader from its state (data/loader_state.hpp): exactly the remaining batches at every cut point, over
// the policy matrix, with and without workers and shuffling; repeated resumes.
#include "../support.hpp"

#include <ATen/Context.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>
#include <optional>

using namespace accel_test;
namespace data = accel::data;

// Over the policy matrix: the state is a position in the plan, whatever the plan's split or tail rules.
TEMPLATE_LIST_TEST_CASE("resuming from a loader's state yields exactly the remaining batches, at every cut point",
                        "[loader][resume]", ShardedMatrix) {
  using Config = TestType;
  struct Setup {
    int N, rank, workers;
    bool shuffle, seedable, drop_last;
    std::int64_t n, batch;
  };
  const std::vector<Setup> setups{{1, 0, 0, true, false, false, 23, 4},  {1, 0, 2, true, false, true, 23, 4},
                                  {2, 1, 0, true, false, false, 21, 3},  {2, 0, 3, true, true, false, 17, 2},
                                  {3, 2, 1, false, false, false, 19, 4}, {1, 0, 0, true, true, false, 10, 3}};
  int ran = 0;
  for (const auto& s : setups) {
    if (Config::split_batches && s.batch % s.N != 0) continue;  // refused under split (tested in prepared_loader.cpp)
    ++ran;
    const data::DataLoaderOptions opt{.batch_size = s.batch,
                                      .shuffle = s.shuffle,
                                      .drop_last = s.drop_last,
                                      .workers = s.workers,
                                      .seedable = s.seedable,
                                      .data_seed = s.seedable ? std::optional<std::uint64_t>(7) : std::nullopt};
    auto make = [&](std::uint64_t seed) {
      at::manual_seed(seed);
      return data::prepare_data_loader<Config>(data::DataLoader(indices(s.n), opt),
                                               data::PrepareContext{s.N, s.rank, nullptr});
    };
    const int epochs = 3;
    Batches reference;
    {
      auto loader = make(42);
      for (int e = 0; e < epochs; ++e) {
        loader.set_epoch(e);
        for (auto& b : run_epoch(loader).first) reference.push_back(b);
      }
    }
    for (std::size_t cut = 0; cut <= reference.size(); ++cut) {
      Batches got;
      data::LoaderState saved;
      {
        auto first = make(42);
        std::size_t taken = 0;
        for (int e = 0; e < epochs && taken < cut; ++e) {
          first.set_epoch(e);
          for (const auto& b : first) {  // the loop is abandoned mid-epoch, with workers in flight
            got.push_back(as_vector(b));
            if (++taken == cut) break;
          }
        }
        saved = first.state_dict();
      }
      auto second = make(999);  // a fresh process: another global seed
      second.load_state_dict(saved);
      for (std::int64_t e = saved.epoch; e < epochs; ++e) {
        second.set_epoch(e);
        for (auto& b : run_epoch(second).first) got.push_back(b);
      }
      INFO("setup n=" << s.n << " N=" << s.N << " workers=" << s.workers << " shuffle=" << s.shuffle
                      << " seedable=" << s.seedable << " cut=" << cut);
      REQUIRE(got == reference);
    }
  }
  CHECK(ran >= 3);
  CHECK(accel::GradientState::instance().active_loaders() == 0);
}

TEST_CASE("repeated resumes: stop, resume, stop again, resume again", "[loader][resume]") {
  const data::DataLoaderOptions opt{.batch_size = 3, .shuffle = true, .workers = 2};
  auto make = [&](std::uint64_t seed) {
    at::manual_seed(seed);
    return data::prepare_data_loader<Even>(data::DataLoader(indices(31), opt), data::PrepareContext{2, 0, nullptr});
  };
  Batches reference;
  {
    auto l = make(5);
    for (int e = 0; e < 3; ++e)
      for (auto& b : run_epoch(l).first) reference.push_back(b);
  }
  for (std::size_t step : {1u, 2u, 5u, 7u}) {
    Batches got;
    data::LoaderState state{};
    bool first = true;
    std::uint64_t seed = 5;
    while (got.size() < reference.size()) {
      auto l = make(seed);
      seed += 1000;  // every "process" starts from another global seed
      if (!first) l.load_state_dict(state);
      first = false;
      std::size_t taken = 0;
      bool stopped = false;
      for (std::int64_t e = l.epoch(); e < 3 && !stopped; ++e) {
        l.set_epoch(e);
        for (const auto& b : l) {
          got.push_back(as_vector(b));
          if (++taken == step) {
            stopped = true;
            break;
          }
        }
      }
      state = l.state_dict();
      if (!stopped) break;
    }
    INFO("a resume every " << step << " batches");
    CHECK(got == reference);
  }
}
