// Accelerate's end-to-end vectors (tests/golden/data/dataloader_*_e2e.json) reproduced by real processes: every case
// whose world size is this job's, batch by batch and end_of_dataloader flag by flag, through the cell of the policy
// matrix (tests/support/policy_matrix.hpp) that has the case's split_batches / even_batches / dispatch_batches.
#include "../harness.hpp"

#include "../../support/policy_matrix.hpp"

#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <numeric>
#include <ranges>
#include <string>

namespace mp {

// The end-to-end golden files of Python Accelerate, reproduced by real processes: every case whose world size
// is this job's, batch by batch and end_of_dataloader flag by flag, sharded or dispatched.
template <class Loader>
void golden_run(const nlohmann::json& c, const accel::ProcessState& state, Loader loader) {
  const auto& expected = c.at("processes")[std::size_t(state.process_index())];
  std::vector<std::vector<std::int64_t>> batches;
  std::vector<bool> ends;
  for (const auto& b : loader) {
    const auto t = b.contiguous();
    batches.emplace_back(t.template data_ptr<std::int64_t>(), t.template data_ptr<std::int64_t>() + t.numel());
    ends.push_back(accel::GradientState::instance().end_of_dataloader());
  }
  const std::string what = c.dump().substr(0, 180);
  check(batches == expected.at("batches").get<std::vector<std::vector<std::int64_t>>>(), "batches of " + what);
  check(ends == expected.at("gs_end_of_dataloader").get<std::vector<bool>>(), "end_of_dataloader of " + what);
  check(loader.size() == batches.size(), "size() of " + what);
}

template <class Config>
void golden_case(const nlohmann::json& c, const accel::ProcessState& state, bool stream, int workers) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(c.at("n").get<std::int64_t>()));
  std::iota(v.begin(), v.end(), 0);
  const accel::data::DataLoaderOptions opt{
      .batch_size = c.at("batch_size"), .drop_last = c.at("drop_last"), .workers = workers, .prefetch = 3};
  if (stream) {  // the same samples as an iterable dataset (a stream: no get(i))
    accel::data::DataLoader dl(std::views::all(v), opt);
    golden_run(c, state, accel::data::prepare_data_loader<Config>(dl, state));
  } else {
    accel::data::DataLoader dl(accel::data::RangeDataset<std::vector<std::int64_t>>(v), opt);
    golden_run(c, state, accel::data::prepare_data_loader<Config>(dl, state));
  }
}

// args: FILE [WORKERS]; `stream`: the dispatched cases read their data as a stream (an iterable dataset).
void golden(const Args& args, bool stream) {
  const std::string path = arg(args, 0, "");
  const int workers = std::stoi(arg(args, 1, "0"));
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  std::ifstream in(path);
  const auto file = nlohmann::json::parse(in);
  int refused = 0;
  for (const auto& c : file.at("cases")) {
    if (c.at("num_processes") != state.num_processes()) continue;
    const bool dispatch = c.at("dispatch_batches"), split = c.at("split_batches"), even = c.at("even_batches");
    const std::int64_t bs = c.at("batch_size");
    if (c.contains("prepare_error") || (split && bs % state.num_processes() != 0)) {
      // Accelerate refuses these too, except split with batch_size 1 under dispatch, which it runs with empty
      // batches (samples lost); accel refuses it (README, differences).
      bool threw = false;
      try {
        accel::data::DataLoader dl(accel::data::RangeDataset<std::vector<std::int64_t>>(std::vector<std::int64_t>(1)),
                                   {.batch_size = bs});
        (void)accel::data::prepare_data_loader<accel::CheckedConfig<accel::dist::gloo, accel::batches::split>>(dl,
                                                                                                               state);
      } catch (const accel::InvalidArgument&) {
        threw = true;
      }
      check(threw, "split with an indivisible batch size is refused");
      ++refused;
      continue;
    }
    // The cell of the policy matrix with this case's flags (dispatching ignores even_batches, as Accelerate does).
    const bool found = accel_test::with_config<accel_test::LoaderMatrix>(
        split, even || dispatch, dispatch,
        [&]<class Config>() { golden_case<Config>(c, state, stream && dispatch, workers); });
    check(found, "a configuration of the policy matrix for " + c.dump().substr(0, 120));
  }
  state.print(stream ? "stream " : "", "golden ", path.substr(path.find_last_of('/') + 1), " on ",
              state.num_processes(), " processes, ", workers, " worker(s): ", refused,
              " configurations refused on purpose");
}

void golden_e2e(const Args& args) { golden(args, false); }
void golden_e2e_stream(const Args& args) { golden(args, true); }

}  // namespace mp
