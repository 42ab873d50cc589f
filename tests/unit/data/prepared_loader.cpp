// Prepared loaders in one process (data/prepared_loader.hpp, data/prepare.hpp): Accelerate's end-to-end vectors over
// the policy matrix (ranks simulated, as Accelerate's own tests do), bad input, range composition.
#include "../support.hpp"

#include <ATen/ops/arange.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <ranges>

using namespace accel_test;
namespace data = accel::data;

namespace {
// One golden case under Config, every rank simulated: its batches, end_of_dataloader flags, size and total batch size.
template <class Config>
void check_shard_case(const nlohmann::json& c) {
  data::DataLoader dl(indices(c.at("n")), {.batch_size = c.at("batch_size"), .drop_last = c.at("drop_last")});
  const int N = c.at("num_processes");
  for (const auto& proc : c.at("processes")) {
    const int r = proc.at("process_index");
    auto loader = data::prepare_data_loader<Config>(dl, data::PrepareContext{N, r, nullptr});
    auto [batches, ends] = run_epoch(loader);
    INFO(c.dump().substr(0, 200) << " rank " << r);
    REQUIRE(batches == proc.at("batches").get<Batches>());
    REQUIRE(ends == proc.at("gs_end_of_dataloader").get<std::vector<bool>>());
    REQUIRE(loader.size() == batches.size());
    REQUIRE(loader.total_batch_size() == proc.at("total_batch_size").get<std::int64_t>());
    auto [again, ends2] = run_epoch(loader);  // a second epoch repeats the first (no shuffle)
    REQUIRE(again == batches);
  }
}
}  // namespace

// One test per cell of the policy matrix; each checks the golden cases of its split_batches / even_batches.
TEMPLATE_LIST_TEST_CASE("ShardedLoader reproduces Accelerate's end-to-end vectors", "[loader][golden]", ShardedMatrix) {
  using Config = TestType;
  const auto file = golden("dataloader_shard_e2e.json");
  std::size_t checked = 0, refused = 0;
  for (const auto& c : file.at("cases")) {
    if (c.at("split_batches") != Config::split_batches || c.at("even_batches") != Config::even_batches) continue;
    if (c.contains("prepare_error")) {
      data::DataLoader dl(indices(c.at("n")), {.batch_size = c.at("batch_size")});
      CHECK_THROWS_WITH(
          (data::prepare_data_loader<Config>(dl, data::PrepareContext{c.at("num_processes"), 0, nullptr})),
          Catch::Contains("must be a round multiple of the number of processes"));
      ++refused;
      continue;
    }
    check_shard_case<Config>(c);
    ++checked;
  }
  CHECK(checked > 150);  // of about 1200 cases in all
  if constexpr (Config::split_batches)
    CHECK(refused > 0);  // only split refuses (an indivisible batch size)
  else
    CHECK(refused == 0);
  CHECK(accel::GradientState::instance().active_loaders() == 0);
}

TEST_CASE("bad input to loaders is a clear error", "[loader][errors]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(data::DataLoader(indices(4), {.batch_size = 0}), Contains("batch_size must be at least 1 (got 0)"));
  data::DataLoader dl(indices(10), {.batch_size = 3});
  CHECK_THROWS_WITH(
      data::prepare_data_loader<Split>(dl, data::PrepareContext{2, 0, nullptr}),
      Contains("under batches::split the batch size (3) must be a round multiple of the number of processes (2)"));
  CHECK_THROWS_WITH(data::prepare_data_loader<Even>(dl, data::PrepareContext{2, 2, nullptr}),
                    Contains("process_index 2 is out of range for 2 processes"));
  struct Ragged {
    std::int64_t size() const { return 4; }
    at::Tensor get(std::int64_t i) const { return at::arange(i + 1); }
  };
  auto ragged = data::prepare_data_loader<Even>(data::DataLoader(Ragged{}, {.batch_size = 2}), data::PrepareContext{});
  CHECK_THROWS_WITH(
      run_epoch(ragged),
      Contains("loading batch 0 of epoch 0 (first sample 0) failed: stack expects each tensor to be equal size"));
  CHECK_THROWS_WITH(data::TensorDataset(at::arange(4), at::arange(3)),
                    Contains("must have the same first dimension (got 4 and 3)"));
  auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{});
  CHECK_THROWS_WITH(l.skip_first_batches(-1), Contains("cannot skip a negative number of batches (-1)"));
}

TEST_CASE("loaders are ranges: std::views and range-v3 compose; tensor datasets gather whole batches",
          "[loader][ranges]") {
  data::DataLoader dl(data::TensorDataset(at::arange(20).reshape({10, 2}), at::arange(10)), {.batch_size = 4});
  auto loader = data::prepare_data_loader<Even>(dl, data::PrepareContext{2, 1, nullptr});
  STATIC_REQUIRE(std::ranges::input_range<decltype(loader)>);
  STATIC_REQUIRE(std::ranges::view<decltype(loader)>);
  STATIC_REQUIRE(ranges::input_range<decltype(loader)>);
  std::vector<std::int64_t> firsts;
  using Example = data::TensorDataset::Example;
  for (auto t : loader | std::views::take(5) |
                    std::views::transform([](const Example& b) { return b.target[0].item<std::int64_t>(); }))
    firsts.push_back(t);
  CHECK((firsts == std::vector<std::int64_t>{4, 2}));  // rank 1 of 2: batch 1 = [4..7], then the padded [2,3,0,1]
  std::vector<std::pair<std::size_t, std::int64_t>> en;
  for (auto [i, t] : loader | ranges::views::take(2) | ranges::views::transform([](const Example& b) {
                       return b.data.size(0);
                     }) | ranges::views::enumerate)
    en.emplace_back(i, t);
  CHECK((en == std::vector<std::pair<std::size_t, std::int64_t>>{{0, 4}, {1, 4}}));
  CHECK(loader.total_batch_size() == 8);
  CHECK(loader.total_dataset_length() == 10);
  auto skipped = loader.skip_first_batches(1);
  CHECK(skipped.size() == 1);
  CHECK(as_vector((*skipped.begin()).target) == std::vector<std::int64_t>{2, 3, 4, 5});
}
