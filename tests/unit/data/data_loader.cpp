// The user's DataLoader (data/data_loader.hpp) unprepared, and LibTorch datasets through TorchDataset
// (data/dataset.hpp).
#include "../support.hpp"

#include <ATen/Context.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/data/datasets/base.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>

using namespace accel_test;
namespace data = accel::data;

namespace {
// A LibTorch dataset, as users of torch::data write them (MNIST has the same shape).
struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(size_t i) override {
    return {at::full({2}, double(i * i)), at::scalar_tensor(std::int64_t(i), at::kLong)};
  }
  torch::optional<size_t> size() const override { return 9; }
};
}  // namespace

TEST_CASE("the user's DataLoader is a range as it is", "[loader][unprepared]") {
  data::DataLoader dl(indices(7), {.batch_size = 3});
  Batches got;
  for (const auto& b : dl) got.push_back(as_vector(b));
  CHECK((got == Batches{{0, 1, 2}, {3, 4, 5}, {6}}));
  CHECK(!accel::GradientState::instance().in_dataloader());
  data::DataLoader shuffled(indices(50), {.batch_size = 50, .shuffle = true});
  at::manual_seed(3);
  const auto e0 = as_vector(*shuffled.begin());
  const auto e1 = as_vector(*shuffled.begin());
  CHECK(e0 != e1);  // every epoch draws a new order
  at::manual_seed(3);
  CHECK(as_vector(*shuffled.begin()) == e0);
}

TEST_CASE("LibTorch datasets plug in through TorchDataset", "[loader][torch]") {
  data::DataLoader dl(data::TorchDataset(Squares{}), {.batch_size = 4});
  auto loader = data::prepare_data_loader<Even>(dl, data::PrepareContext{2, 1, nullptr});
  std::vector<std::int64_t> targets;
  for (const auto& b : loader) {
    CHECK(b.data.size(1) == 2);
    for (auto t : as_vector(b.target)) targets.push_back(t);
  }
  CHECK((targets == std::vector<std::int64_t>{4, 5, 6, 7, 3, 4, 5, 6}));  // rank 1 of 2; the last batch padded
}
