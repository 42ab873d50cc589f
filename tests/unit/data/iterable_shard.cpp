// Iterable datasets (data/iterable_shard.hpp, the stream loaders): the streaming view equals the plan, and every
// process reads the stream and keeps Accelerate's share, with and without workers.
#include "../support.hpp"

#include <accel/data/iterable_shard.hpp>
#include <accel/data/loader.hpp>
#include <algorithm>
#include <catch2/catch.hpp>
#include <ranges>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE("iterable shards: the streaming view equals the plan, and interleaves back into the stream",
          "[plan][property]") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 800; ++trial) {
    auto s = random_spec(rng, /*small=*/true);
    const std::int64_t n = std::int64_t(rng() % 50);
    const auto source = std::views::iota(std::int64_t{0}, n);
    std::vector<Yield> all;
    for (int r = 0; r < s.num_processes; ++r) {
      s.process_index = r;
      const auto closed = yield_of(accel::plan::iterable_plan(s, n));
      std::vector<std::int64_t> flat, flat_closed;
      std::vector<bool> pad, pad_closed;
      for (const auto& x : data::IterableShard(source, {.batch_size = s.batch_size,
                                                       .drop_last = s.drop_last,
                                                       .num_processes = s.num_processes,
                                                       .process_index = r,
                                                       .split_batches = s.split_batches})) {
        flat.push_back(x.value);
        pad.push_back(x.padding);
      }
      for (std::size_t j = 0; j < closed.batches.size(); ++j)
        for (std::size_t i = 0; i < closed.batches[j].size(); ++i) {
          flat_closed.push_back(closed.batches[j][i]);
          pad_closed.push_back(std::int64_t(i) >= closed.real[j]);
        }
      REQUIRE(flat == flat_closed);
      REQUIRE(pad == pad_closed);
      all.push_back(closed);
    }
    // Upstream's property: equal lengths; interleaving the shards reproduces the stream, cycled when padded.
    const std::int64_t per = s.split_batches ? s.batch_size / s.num_processes : s.batch_size;
    for (const auto& y : all) REQUIRE(y.batches.size() == all[0].batches.size());
    std::vector<std::int64_t> interleaved;
    for (std::size_t j = 0; j < all[0].batches.size(); ++j)
      for (const auto& y : all) interleaved.insert(interleaved.end(), y.batches[j].begin(), y.batches[j].end());
    for (std::size_t i = 0; i < interleaved.size(); ++i)
      if (std::int64_t(i) < n)
        REQUIRE(interleaved[i] == std::int64_t(i));
      else
        REQUIRE(interleaved[i] ==
                (std::int64_t(i) - n) % std::min(n, s.split_batches ? s.batch_size : s.batch_size * s.num_processes));
    if (per > 0 && !s.drop_last) REQUIRE(std::int64_t(interleaved.size()) >= n);
  }
}

TEST_CASE("iterable datasets: every process reads the stream and keeps Accelerate's share, with and without workers",
          "[loader][iterable]") {
  const auto file = accel_test::golden("iterable_dataset_shard.json");
  std::size_t checked = 0;
  for (const auto& c : file.at("cases")) {
    const int N = c.at("num_processes");
    const std::int64_t n = c.at("n"), bs = c.at("batch_size");
    const bool split = c.at("split_batches"), dl = c.at("drop_last");
    if (N == 1 || c.contains("constructor_error") || (split && bs % N != 0)) continue;  // one process: not sharded
    std::vector<std::int64_t> stream(static_cast<std::size_t>(n));
    std::iota(stream.begin(), stream.end(), 0);
    auto source = std::views::all(stream);
    for (int workers : {0, 2})  // workers read the stream in order and collate ahead of the loop
      for (const auto& proc : c.at("processes")) {
        data::DataLoader loader(source, {.batch_size = bs, .drop_last = dl, .workers = workers});
        const int r = proc.at("process_index");
        // Iterable shards know no uneven tail (Accelerate pads every stream): the even cell of split_batches.
        const bool found = with_config<ShardedMatrix>(split, true, false, [&]<class Config>() {
          auto l = data::prepare_data_loader<Config>(loader, data::PrepareContext{N, r, nullptr});
          std::vector<std::int64_t> flat;
          std::vector<bool> ends;
          std::size_t batches = 0;
          for (const auto& b : l) {
            for (auto x : as_vector(b)) flat.push_back(x);
            ends.push_back(accel::GradientState::instance().end_of_dataloader());
            const auto layout = accel::GradientState::instance().layout();
            REQUIRE(layout.real.size() == std::size_t(N));
            ++batches;
          }
          INFO(c.dump().substr(0, 160) << " rank " << r << ", " << workers << " worker(s)");
          REQUIRE(flat == proc.at("samples").get<std::vector<std::int64_t>>());
          REQUIRE(l.size() == batches);
          if (!ends.empty()) REQUIRE(ends.back());
          REQUIRE(std::count(ends.begin(), ends.end(), true) == (ends.empty() ? 0 : 1));
        });
        REQUIRE(found);
      }
    ++checked;
  }
  CHECK(checked > 500);
  // One process batches the stream as it comes (no padding); resuming re-reads and skips.
  std::vector<std::int64_t> seven{0, 1, 2, 3, 4, 5, 6};
  data::DataLoader one(std::views::all(seven), {.batch_size = 3});
  Batches got;
  for (const auto& b : one) got.push_back(as_vector(b));
  CHECK((got == Batches{{0, 1, 2}, {3, 4, 5}, {6}}));
  auto l = data::prepare_data_loader<Even>(one, data::PrepareContext{2, 1, nullptr});
  auto first = *l.begin();
  auto saved = l.state_dict();
  CHECK((saved.epoch == 0 && saved.batches == 1));
  auto resumed = data::prepare_data_loader<Even>(one, data::PrepareContext{2, 1, nullptr});
  resumed.load_state_dict(saved);
  Batches rest;
  for (const auto& b : resumed) rest.push_back(as_vector(b));
  CHECK((as_vector(first) == std::vector<std::int64_t>{3, 4, 5}));
  CHECK(
      (rest == Batches{{2, 3, 4}}));  // rank 1's second batch: the last chunk [6, 0, 1, 2, 3, 4] padded from the first
  CHECK(!accel::GradientState::instance().in_dataloader());
}
