// GradientState (state/gradient_state.hpp) follows the loops: nested loaders, abandoned loops; a rank out of batches
// repeats its last step, until a repeated call ends the repeat.
#include "../support.hpp"

#include <accel/data/loader.hpp>
#include <accel/state/gradient_state.hpp>
#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>

#include <string>
#include <vector>

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
  {
    auto it = outer.begin();
    CHECK(gs.in_dataloader());
  }  // abandoned: unregisters with its iterator
  CHECK(!gs.in_dataloader());
}

TEST_CASE("joined steps: the last step is repeated for each missing step, until a call stops the repeat",
          "[gradient_state]") {
  auto& gs = accel::GradientState::instance();
  using Kind = accel::GradientState::CallKind;
  // A rank that lacks 3 steps, with one batch of its own and 3 recorded calls; the second stops the repeat at its
  // `stop_at`-th repetition (0: never).
  auto repeat = [&](int stop_at) {
    std::string calls;
    accel::GradientState::Registration reg(&gs);
    reg.record_steps(std::vector<accel::GradientState::LoaderView>(3));
    reg.update({});
    CHECK(gs.recording());
    int b = 0;
    auto live = [] {};
    gs.joined(Kind::local, live, [&] { return [&] { calls += 'a'; }; });
    gs.joined(Kind::collective, live, [&] {
      return [&, stop_at] {
        calls += 'b';
        if (++b == stop_at) gs.stop_repeating();
      };
    });
    gs.joined(Kind::local, live, [&] { return [&] { calls += 'c'; }; });
    CHECK(reg.join());
    return calls;
  };
  CHECK(repeat(0) == "abcabcabc");
  CHECK(repeat(2) == "abcab");  // the rest of that step and the steps after it are not repeated
  CHECK(repeat(1) == "ab");
  gs.stop_repeating();  // outside a repeated step: nothing to stop
  CHECK(repeat(0) == "abcabcabc");
}

TEST_CASE("the joined-step door: live calls pass through, repeats are made only while recording, in the order issued",
          "[gradient_state]") {
  auto& gs = accel::GradientState::instance();
  using Kind = accel::GradientState::CallKind;
  int made = 0;
  // No loader records: the live call runs and returns its value; the repeat is never made.
  CHECK(gs.joined(
            Kind::collective, [] { return 7; }, [&] { return ++made, [] {}; }) == 7);
  CHECK(made == 0);

  std::string calls;
  accel::GradientState::Registration reg(&gs);
  reg.record_steps(std::vector<accel::GradientState::LoaderView>(2));
  reg.update({});
  // A call issued inside another's live call (a unit's all-gather inside a model's forward) is repeated after it,
  // although its repeat is made first; the outer repeat sees what the live call computed.
  int seen = 0;
  const int out = gs.joined(
      Kind::local,
      [&] {
        gs.joined(
            Kind::collective, [] {}, [&] { return ++made, [&] { calls += 'i'; }; });
        seen = 42;
        return 1;
      },
      [&] { return ++made, [&, s = seen] { calls += s == 42 ? 'o' : '?'; }; });
  CHECK(out == 1);
  CHECK(made == 2);
  // A live call that throws leaves nothing to repeat (its place stays, empty); what a repeat returns lives until
  // the end of the repeated step.
  CHECK_THROWS_AS(gs.joined(
                      Kind::local, []() -> int { throw std::runtime_error("live"); },
                      [&] { return ++made, [&] { calls += 'x'; }; }),
                  std::runtime_error);
  CHECK(made == 2);
  struct Probe {  // what a repeated call returns: released when its repeated step ends
    std::string* calls;
    ~Probe() { *calls += 'd'; }
  };
  gs.joined(
      Kind::local, [] {},
      [&] {
        return [&] {
          calls += 'k';
          return std::make_shared<Probe>(&calls);
        };
      });
  CHECK(reg.join());
  CHECK(calls == "oikdoikd");
}
