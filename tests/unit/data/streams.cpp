// Streams of unknown length (data/dataset.hpp `IterableDataset`, pipeline/stream_source.hpp) in one process, ranks
// simulated: a range with no size(), a file reader and an endless generator load exactly as a sized stream of the
// same samples does, on every sharded cell of the policy matrix and dispatched, with 0, 1 and 2 workers; cut by
// the loop; resumed at every cut; and their prepared loaders have no size() (the multi-process runs are
// tests/distributed/data/streams.cpp).
#include "../support.hpp"

#include "../../support/streams.hpp"

#include <unistd.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <ranges>

using namespace accel_test;
namespace data = accel::data;

namespace {
template <class L>
constexpr bool has_size = requires(const L& l) {
  l.size();
};

using Solo = accel::Config<accel::dist::none, accel::place::none, accel::rng::none>;
using Dispatched = accel::CheckedConfig<accel::dist::gloo, accel::loading::dispatched>;

std::filesystem::path scratch(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("accel_streams_" + std::to_string(::getpid()) + "_" + name);
}
}  // namespace

TEST_CASE("a stream with no size(): the dataset concepts and the prepared loaders' size()", "[loader][stream]") {
  static_assert(data::IterableDataset<Generated> && !std::ranges::sized_range<const Generated>);
  static_assert(data::IterableDataset<LinesOfFile> && !std::ranges::sized_range<const LinesOfFile>);
  static_assert(data::IterableDataset<decltype(endless())> && !std::ranges::sized_range<decltype(endless())>);
  using V = decltype(std::views::all(std::declval<const std::vector<std::int64_t>&>()));
  static_assert(data::IterableDataset<V> && std::ranges::sized_range<const V>);
  // The prepared loader of a stream of unknown length has no size() (a compile-time error, not a wrong number);
  // that of a sized stream has one. The user's DataLoader has one only for a map-style dataset.
  using Unsized = decltype(data::prepare_data_loader<Solo>(data::DataLoader(Generated{}), data::PrepareContext{}));
  using Endless = decltype(data::prepare_data_loader<Dispatched>(data::DataLoader(endless()), data::PrepareContext{}));
  using Sized = decltype(data::prepare_data_loader<Even>(
      data::DataLoader(std::views::all(std::declval<const std::vector<std::int64_t>&>())), data::PrepareContext{}));
  static_assert(!has_size<Unsized> && !has_size<Endless> && has_size<Sized>);
  static_assert(!has_size<data::DataLoader<Generated>> && has_size<data::DataLoader<Indices>>);
  // Its state records "a stream of unknown length".
  auto l = data::prepare_data_loader<Solo>(data::DataLoader(Generated{5}, {.batch_size = 2}), data::PrepareContext{});
  CHECK(take(l, -1).first == Batches{{0, 1}, {2, 3}, {4}});
  CHECK(l.state_dict().samples == -1);
  CHECK_THROWS_WITH(data::DataLoader(Generated{5}, {.batch_size = 2, .shuffle = true}).begin(),
                    Catch::Contains("an iterable dataset cannot be shuffled by the loader"));
}

// Every sharded cell, every simulated rank of 1 to 4 processes: the unsized streams equal the sized one batch for
// batch and flag for flag (the sized stream's batches are checked against Accelerate's IterableDatasetShard).
TEMPLATE_LIST_TEST_CASE("streams with no size() load as the sized stream of the same samples", "[loader][stream]",
                        ShardedMatrix) {
  using Config = TestType;
  const auto file = scratch("lines");
  int compared = 0;
  for (const std::int64_t n : {0, 1, 7, 13, 24})
    for (const std::int64_t batch : {1, 3, 4})
      for (const bool drop_last : {false, true})
        for (int N = 1; N <= 4; ++N) {
          if (Config::split_batches && batch % N != 0) continue;  // refused (prepared_loader.cpp)
          const auto v = iota_vector(n);
          const LinesOfFile lines = LinesOfFile::written(file, n);
          for (int r = 0; r < N; ++r)
            for (const int workers : {0, 1, 2}) {
              const data::DataLoaderOptions o{.batch_size = batch, .drop_last = drop_last, .workers = workers};
              const data::PrepareContext ctx{N, r, nullptr};
              auto sized = data::prepare_data_loader<Config>(data::DataLoader(std::views::all(v), o), ctx);
              auto generated = data::prepare_data_loader<Config>(data::DataLoader(Generated{n}, o), ctx);
              auto read = data::prepare_data_loader<Config>(data::DataLoader(lines, o), ctx);
              const auto expected = run_epoch(sized);
              INFO("n=" << n << " batch=" << batch << " drop_last=" << drop_last << " N=" << N << " rank=" << r
                        << " workers=" << workers);
              REQUIRE(expected.first.size() == sized.size());
              REQUIRE(run_epoch(generated) == expected);
              REQUIRE(run_epoch(read) == expected);
              REQUIRE(run_epoch(generated) == expected);  // a second pass reads the stream again
              ++compared;
            }
        }
  std::filesystem::remove(file);
  CHECK(compared > 300);
  CHECK(accel::GradientState::instance().active_loaders() == 0);
}

TEST_CASE("one process, dispatched: the unsized streams equal the sized one", "[loader][stream]") {
  const auto file = scratch("lines_dispatched");
  for (const std::int64_t n : {0, 5, 12})
    for (const bool drop_last : {false, true})
      for (const int workers : {0, 1, 2}) {
        const data::DataLoaderOptions o{.batch_size = 4, .drop_last = drop_last, .workers = workers};
        const auto v = iota_vector(n);
        auto sized =
            data::prepare_data_loader<Dispatched>(data::DataLoader(std::views::all(v), o), data::PrepareContext{});
        auto generated =
            data::prepare_data_loader<Dispatched>(data::DataLoader(Generated{n}, o), data::PrepareContext{});
        auto read = data::prepare_data_loader<Dispatched>(data::DataLoader(LinesOfFile::written(file, n), o),
                                                          data::PrepareContext{});
        const auto expected = run_epoch(sized);
        INFO("n=" << n << " drop_last=" << drop_last << " workers=" << workers);
        CHECK(run_epoch(generated) == expected);
        CHECK(run_epoch(read) == expected);
      }
  std::filesystem::remove(file);
}

// An endless stream: the loop takes k batches and leaves (workers in flight, the look-ahead read); the next epoch
// starts the stream again; the first batches are those of a long enough finite stream.
TEMPLATE_LIST_TEST_CASE("an endless stream cut by the loop", "[loader][stream]", ShardedMatrix) {
  using Config = TestType;
  for (int N = 1; N <= 3; ++N)
    for (int r = 0; r < N; ++r)
      for (const int workers : {0, 1, 2}) {
        const std::int64_t batch = Config::split_batches ? 2 * N : 3;
        const data::DataLoaderOptions o{.batch_size = batch, .workers = workers, .prefetch = 4};
        const data::PrepareContext ctx{N, r, nullptr};
        const auto v = iota_vector(1000);
        auto finite = data::prepare_data_loader<Config>(data::DataLoader(std::views::all(v), o), ctx);
        auto stream = data::prepare_data_loader<Config>(data::DataLoader(endless(), o), ctx);
        INFO("N=" << N << " rank=" << r << " workers=" << workers);
        for (const std::int64_t k : {1, 5, 11}) {
          const auto expected = take(finite, k);
          const auto got = take(stream, k);
          REQUIRE(got.first == expected.first);
          REQUIRE(std::ranges::none_of(got.second, [](bool end) { return end; }));
        }
        CHECK(accel::GradientState::instance().active_loaders() == 0);
      }
}

// Resumed from its state at every cut: the rest of the epoch and the next one, exactly (the stream is read again
// and the consumed items dropped), for the unsized streams, sharded and dispatched, with and without workers.
TEMPLATE_LIST_TEST_CASE("a stream with no size() resumes exactly at every cut", "[loader][stream][resume]",
                        ShardedMatrix) {
  using Config = TestType;
  struct Setup {
    int N, rank, workers;
    bool drop_last;
    std::int64_t n, batch;
  };
  const std::vector<Setup> setups{
      {1, 0, 0, false, 23, 4}, {2, 1, 2, false, 21, 2}, {3, 2, 1, true, 19, 3}, {2, 0, 0, false, 9, 4}};
  const auto file = scratch("lines_resume");
  for (const auto& s : setups) {
    if (Config::split_batches && s.batch % s.N != 0) continue;
    const data::DataLoaderOptions o{.batch_size = s.batch, .drop_last = s.drop_last, .workers = s.workers};
    const data::PrepareContext ctx{s.N, s.rank, nullptr};
    const LinesOfFile lines = LinesOfFile::written(file, s.n);
    auto run = [&](auto dataset) {
      Batches reference;
      {
        auto l = data::prepare_data_loader<Config>(data::DataLoader(dataset, o), ctx);
        for (int e = 0; e < 2; ++e) {
          l.set_epoch(e);
          for (auto& b : run_epoch(l).first) reference.push_back(b);
        }
      }
      for (std::size_t cut = 0; cut <= reference.size(); ++cut) {
        Batches got;
        data::LoaderState saved;
        {
          auto first = data::prepare_data_loader<Config>(data::DataLoader(dataset, o), ctx);
          std::size_t taken = 0;
          for (int e = 0; e < 2 && taken < cut; ++e) {
            first.set_epoch(e);
            for (const auto& b : first) {
              got.push_back(as_vector(b));
              if (++taken == cut) break;
            }
          }
          saved = first.state_dict();
        }
        auto second = data::prepare_data_loader<Config>(data::DataLoader(dataset, o), ctx);
        second.load_state_dict(saved);
        for (std::int64_t e = saved.epoch; e < 2; ++e) {
          second.set_epoch(e);
          for (auto& b : run_epoch(second).first) got.push_back(b);
        }
        INFO("n=" << s.n << " N=" << s.N << " rank=" << s.rank << " workers=" << s.workers << " cut=" << cut);
        REQUIRE(got == reference);
      }
    };
    run(Generated{s.n});
    run(lines);
  }
  std::filesystem::remove(file);
  // A state of a stream of unknown length resumes only into such a stream: the loader says what differs.
  auto saved = data::prepare_data_loader<Config>(data::DataLoader(Generated{8}, {.batch_size = 2}),
                                                 data::PrepareContext{2, 0, nullptr});
  (void)take(saved, 1);
  const auto v = iota_vector(8);
  auto other = data::prepare_data_loader<Config>(data::DataLoader(std::views::all(v), {.batch_size = 2}),
                                                 data::PrepareContext{2, 0, nullptr});
  CHECK_THROWS_WITH(other.load_state_dict(saved.state_dict()), Catch::Contains("a stream of unknown length"));
}

// An endless stream resumed: the batches after the cut are those the uncut loop would have taken next.
TEST_CASE("an endless stream resumes after the cut", "[loader][stream][resume]") {
  for (const int workers : {0, 2}) {
    const data::DataLoaderOptions o{.batch_size = 3, .workers = workers};
    const data::PrepareContext ctx{2, 1, nullptr};
    auto straight = data::prepare_data_loader<Even>(data::DataLoader(endless(), o), ctx);
    const auto all = take(straight, 12).first;
    auto first = data::prepare_data_loader<Even>(data::DataLoader(endless(), o), ctx);
    const auto head = take(first, 5).first;
    auto second = data::prepare_data_loader<Even>(data::DataLoader(endless(), o), ctx);
    second.load_state_dict(first.state_dict());
    const auto tail = take(second, 7).first;
    Batches got = head;
    got.insert(got.end(), tail.begin(), tail.end());
    INFO("workers=" << workers);
    CHECK(got == all);
  }
}
