// Streams of unknown length on real processes (pipeline/stream_source.hpp): a range with no size(), a file reader and
// an endless generator, on every cell of the policy matrix (sharded and dispatched), with 0, 1 and 2 workers: the
// batches and end_of_dataloader flags of a sized stream of the same samples (checked against Accelerate's vectors by
// golden-stream), the loop cut mid-stream, and resumed from a loader's state at every cut.
#include "../harness.hpp"

#include "../../support/policy_matrix.hpp"
#include "../../support/samples.hpp"
#include "../../support/streams.hpp"

#include <accel/data/loader.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <ranges>
#include <string>
#include <vector>

namespace mp {

namespace stream_tests {
using accel_test::Batches;
using accel_test::take;

template <class Config>
int streams_of(const accel::ProcessState& state, const std::filesystem::path& file, int workers) {
  const int N = state.num_processes();
  const std::string cell = std::string(Config::split_batches ? "split" : "per_process") +
                           (Config::even_batches ? "/even" : "/uneven") +
                           (Config::dispatch ? "/dispatched" : "/sharded") + " workers=" + std::to_string(workers);
  int runs = 0;
  // Whole epochs: the unsized streams equal the sized one.
  for (const std::int64_t n : {0, 1, 7, 13, 24})
    for (const std::int64_t batch : {1, 3, 4})
      for (const bool drop_last : {false, true}) {
        if (Config::split_batches && batch % N != 0) continue;
        const auto v = accel_test::iota_vector(n);
        const accel::data::DataLoaderOptions o{.batch_size = batch, .drop_last = drop_last, .workers = workers};
        auto sized = accel::data::prepare_data_loader<Config>(accel::data::DataLoader(std::views::all(v), o), state);
        auto generated =
            accel::data::prepare_data_loader<Config>(accel::data::DataLoader(accel_test::Generated{n}, o), state);
        auto read = accel::data::prepare_data_loader<Config>(
            accel::data::DataLoader(accel_test::LinesOfFile::written(file, n), o), state);
        const auto expected = take(sized, -1);
        const std::string what = cell + " n=" + std::to_string(n) + " batch=" + std::to_string(batch) +
                                 " drop_last=" + std::to_string(drop_last);
        check(expected.first.size() == sized.size(), "the sized stream's size(), " + what);
        check(take(generated, -1) == expected, "a range with no size(), " + what);
        check(take(read, -1) == expected, "a file reader, " + what);
        ++runs;
      }
  // An endless stream, the loop cut after k batches (every rank cuts at the same batch, as a training loop does).
  {
    const std::int64_t batch = Config::split_batches ? 2 * N : 3;
    const accel::data::DataLoaderOptions o{.batch_size = batch, .workers = workers, .prefetch = 4};
    const auto v = accel_test::iota_vector(2000);
    auto finite = accel::data::prepare_data_loader<Config>(accel::data::DataLoader(std::views::all(v), o), state);
    auto stream = accel::data::prepare_data_loader<Config>(accel::data::DataLoader(accel_test::endless(), o), state);
    for (const std::int64_t k : {1, 6, 13}) {
      const auto expected = take(finite, k);
      const auto got = take(stream, k);
      check(got.first == expected.first, "an endless stream cut after " + std::to_string(k) + " batches, " + cell);
      check(std::ranges::none_of(got.second, [](bool e) { return e; }), "an endless stream never ends, " + cell);
    }
    ++runs;
  }
  // Resumed from this rank's state at every cut of two epochs of a stream with no size().
  {
    const std::int64_t batch = Config::split_batches ? N : 2;
    const accel::data::DataLoaderOptions o{.batch_size = batch, .workers = workers};
    auto make = [&] {
      return accel::data::prepare_data_loader<Config>(accel::data::DataLoader(accel_test::Generated{17}, o), state);
    };
    Batches reference;
    {
      auto l = make();
      for (int e = 0; e < 2; ++e) {
        l.set_epoch(e);
        for (auto& b : take(l, -1).first) reference.push_back(b);
      }
    }
    for (std::size_t cut = 0; cut <= reference.size(); ++cut) {
      Batches got;
      accel::data::LoaderState saved;
      {
        auto first = make();
        std::size_t taken = 0;
        for (int e = 0; e < 2 && taken < cut; ++e) {
          first.set_epoch(e);
          for (auto& b : take(first, std::int64_t(cut - taken)).first) got.push_back(b), ++taken;
        }
        saved = first.state_dict();
      }
      auto second = make();
      second.load_state_dict(saved);
      for (std::int64_t e = saved.epoch; e < 2; ++e) {
        second.set_epoch(e);
        for (auto& b : take(second, -1).first) got.push_back(b);
      }
      check(got == reference, "a stream with no size() resumed after " + std::to_string(cut) + " batches, " + cell);
    }
    ++runs;
  }
  check(accel::GradientState::instance().active_loaders() == 0, "no loader left active, " + cell);
  return runs;
}
}  // namespace stream_tests

// args: none. Every cell of the loader matrix, 0, 1 and 2 workers.
void streams(const Args&) {
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  const auto file = std::filesystem::temp_directory_path() /
                    ("accel_mp_streams_" + std::to_string(::getpid()) + "_" + std::to_string(state.process_index()));
  int runs = 0;
  for (const int workers : {0, 1, 2})
    [&]<class... Cs>(std::tuple<Cs...>*) {
      ((runs += stream_tests::streams_of<Cs>(state, file, workers)), ...);
    }(static_cast<accel_test::LoaderMatrix*>(nullptr));
  std::filesystem::remove(file);
  state.print("streams of unknown length on ", state.num_processes(), " processes: ", runs, " runs over ",
              std::tuple_size_v<accel_test::LoaderMatrix>, " configurations and 0-2 workers");
}

}  // namespace mp
