// Loader workers (pipeline/prefetcher.hpp) through a prepared loader: order, error forwarding, clean stop.
#include "../support.hpp"

#include <ATen/ops/scalar_tensor.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>
#include <stdexcept>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE("workers prepare batches in order, forward errors, and stop cleanly", "[loader][workers]") {
  struct Flaky {
    std::int64_t size() const { return 40; }
    at::Tensor get(std::int64_t i) const {
      if (i == 17) throw std::runtime_error("sample 17 is corrupt");
      return at::scalar_tensor(i, at::kLong);
    }
  };
  const auto sequential = [] {
    data::DataLoader dl(indices(40), {.batch_size = 3, .workers = 0});
    auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{});
    return run_epoch(l).first;
  }();
  for (int workers : {1, 2, 4}) {
    data::DataLoader dl(indices(40), {.batch_size = 3, .workers = workers, .prefetch = 1});
    auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{});
    CHECK(run_epoch(l).first == sequential);
    int seen = 0;
    for (const auto& b : l) {  // abandon the epoch with batches in flight: the workers are joined
      (void)b;
      if (++seen == 2) break;
    }
    CHECK(accel::GradientState::instance().active_loaders() == 0);
    data::DataLoader bad(Flaky{}, {.batch_size = 4, .workers = workers});
    auto lb = data::prepare_data_loader<Even>(bad, data::PrepareContext{});
    CHECK_THROWS_WITH(
        run_epoch(lb),
        Catch::Contains("rank 0: loading batch 4 of epoch 0 (first sample 16) failed: sample 17 is corrupt"));
  }
}
