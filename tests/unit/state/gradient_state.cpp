// GradientState (state/gradient_state.hpp) follows the loops: nested loaders, abandoned loops.
#include "../support.hpp"

#include <accel/data/loader.hpp>
#include <accel/state/gradient_state.hpp>
#include <catch2/catch.hpp>

using namespace accel_test;
namespace data = accel::data;

TEST_CASE("GradientState follows the loops: nested loaders, abandoned loops", "[loader][gradient_state]") {
  auto& gs = accel::GradientState::instance();
  data::DataLoader outer_dl(indices(6), {.batch_size = 2});
  data::DataLoader inner_dl(indices(4), {.batch_size = 4});
  auto outer = data::prepare_data_loader<Even>(outer_dl, data::PrepareContext{2, 0, nullptr});
  auto inner = data::prepare_data_loader<Even>(inner_dl, data::PrepareContext{2, 1, nullptr});
  CHECK(!gs.in_dataloader());
  std::vector<bool> outer_ends;
  for (const auto& b : outer) {
    (void)b;
    outer_ends.push_back(gs.end_of_dataloader());
    for (const auto& c : inner) {
      (void)c;
      CHECK(gs.active_loaders() == 2);
      CHECK(gs.end_of_dataloader());  // inner has one batch: [2,3,0,1]
      CHECK((gs.layout().real == std::vector<std::int64_t>{4, 0}));
    }
    CHECK(gs.active_loaders() == 1);
  }
  CHECK((outer_ends == std::vector<bool>{false, true}));
  CHECK(!gs.in_dataloader());
  { auto it = outer.begin(); CHECK(gs.in_dataloader()); }  // abandoned: unregisters with its iterator
  CHECK(!gs.in_dataloader());
}
