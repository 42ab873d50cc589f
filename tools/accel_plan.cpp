// accel-plan: prints which samples every process gets, batch by batch, for a loader configuration (also the rest of
// an epoch resumed at another number of processes: --start, --resumed-from); or recomputes a golden file of Python
// Accelerate's vectors from its parameters (--golden F --emit|--check).
#include "plan/golden.hpp"

#include <accel/data/sampler.hpp>
#include <accel/plan/plan.hpp>

#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

namespace {

using accel_plan::json;
namespace plan = accel::plan;
namespace data = accel::data;

struct Args {
  std::int64_t samples = 0, batch_size = 1, skip = 0, epoch = 0, start = 0;
  int processes = 1, resumed_from = 0;
  bool split = false, uneven = false, drop_last = false, shuffle = false, seedable = false;
  bool iterable = false, dispatch = false, as_json = false;
  std::uint64_t seed = 0;
  std::optional<std::uint64_t> data_seed;
  std::string golden;
  bool emit = false, check = false;
};

int run_golden(const Args& a) {
  std::ifstream in(a.golden, std::ios::binary);
  if (!in) {
    std::cerr << "accel-plan: cannot read " << a.golden << "\n";
    return 2;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json ref = accel_plan::read_golden(text, a.golden);
  const json& cases = ref.at("cases");
  if (a.emit) {
    json out{{"meta", ref.value("meta", json::object())}, {"cases", json::array()}};
    out["meta"]["emitted_by"] = "accel-plan --golden --emit";
    for (std::size_t i = 0; i < cases.size(); ++i)
      out["cases"].push_back(accel_plan::on_case(i, a.golden, [&] { return accel_plan::emit_case(cases[i]); }));
    // One case per line, like the reference files.
    std::cout << "{\"meta\": " << out["meta"].dump() << ", \"cases\": [\n";
    for (std::size_t i = 0; i < out["cases"].size(); ++i)
      std::cout << out["cases"][i].dump() << (i + 1 < out["cases"].size() ? ",\n" : "\n");
    std::cout << "]}\n";
    return 0;
  }
  const auto result = accel_plan::check_golden(ref, a.golden);
  for (const auto& f : result.failures) std::cout << "FAILED " << f << "\n";
  std::cout << a.golden.substr(a.golden.find_last_of('/') + 1) << ": " << result.passed << " passed, " << result.failed
            << " failed\n";
  return result.failed == 0 ? 0 : 1;
}

int run_plan(const Args& a) {
  plan::Loading loading = a.dispatch   ? plan::Loading::dispatched
                          : a.iterable ? plan::Loading::iterable
                                       : plan::Loading::sharded;
  std::optional<data::ShuffledOrders> orders;
  data::IndexOrder order = data::IndexOrder::sequential(a.samples);
  if (a.shuffle) {
    at::manual_seed(a.seed);
    // Only rank 0 samples under dispatch: one process's view of the generator.
    // A resumed epoch's order is the one the job that saved the checkpoint drew (its number of processes' rule).
    const int drew = a.resumed_from > 0 ? a.resumed_from : a.processes;
    orders.emplace(a.samples, a.dispatch ? 1 : drew, a.seedable ? data::Shuffle::seedable : data::Shuffle::synchronized,
                   a.data_seed);
    for (std::int64_t e = 0; e <= a.epoch; ++e) order = orders->next(e);
  }
  json out = json::array();
  for (int r = 0; r < a.processes; ++r) {
    const plan::ShardSpec spec{.batch_size = a.batch_size,
                               .drop_last = a.drop_last,
                               .num_processes = a.processes,
                               .process_index = r,
                               .split_batches = a.split,
                               .even_batches = !a.uneven};
    const auto p = plan::loader_plan(spec, a.samples, loading, a.start).skip(a.skip);
    json batches = json::array();
    for (std::int64_t j = 0; j < p.size(); ++j) {
      const auto s = p.span(j);
      json idx = json::array();
      for (auto pos = s.begin; pos < s.end; ++pos) idx.push_back(order[p.sample(pos)]);
      batches.push_back(
          {{"indices", idx}, {"padding", s.size() - p.real(j)}, {"end_of_dataloader", p.end_of_dataloader(j)}});
    }
    out.push_back({{"process_index", r}, {"size", p.size()}, {"batches", batches}});
  }
  if (a.as_json) {
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (a.start > 0 || a.resumed_from > 0)
    std::cout << "the rest of epoch " << a.epoch << " from sample " << a.start << " of " << a.samples
              << ", checkpoint of " << (a.resumed_from > 0 ? a.resumed_from : a.processes) << " process(es), now "
              << a.processes << "\n";
  for (const auto& proc : out) {
    std::cout << "process " << proc["process_index"] << ": " << proc["size"] << " batches\n";
    std::int64_t j = a.skip;
    for (const auto& b : proc["batches"]) {
      const auto& idx = b["indices"];
      const auto real = idx.size() - b["padding"].get<std::size_t>();
      std::cout << "  batch " << j++ << ":";
      for (std::size_t i = 0; i < idx.size(); ++i)
        std::cout << ' ' << idx[i].get<std::int64_t>() << (i >= real ? "*" : "");
      if (b["end_of_dataloader"].get<bool>()) std::cout << "   <- end_of_dataloader";
      std::cout << "\n";
    }
  }
  std::cout << "(* = padding: a duplicate that gather_for_metrics drops)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accel-plan: which samples each process gets, batch by batch, exactly as Accelerate shards them"};
  Args a;
  app.add_option("--samples,-n", a.samples, "dataset length")->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size,-b", a.batch_size, "the loader's batch_size (global with --split-batches)");
  app.add_option("--processes,-p", a.processes, "number of processes");
  app.add_flag("--split-batches", a.split, "batches::split: batch_size is global and split between processes");
  app.add_flag("--uneven", a.uneven, "tail::uneven (even_batches=False)");
  app.add_flag("--drop-last", a.drop_last, "the loader's drop_last");
  app.add_flag("--shuffle", a.shuffle, "shuffle=True with the synchronised generator (or --seedable)");
  app.add_option("--seed", a.seed, "the job's seed (set_seed) for --shuffle");
  app.add_option("--epoch", a.epoch, "which epoch to show (for --shuffle)")->check(CLI::NonNegativeNumber);
  app.add_flag("--seedable", a.seedable, "use_seedable_sampler=True");
  app.add_option("--data-seed", a.data_seed, "data_seed for --seedable");
  app.add_option("--skip", a.skip, "skip_first_batches: batches of the prepared loader to skip");
  app.add_option("--start", a.start,
                 "a resumed epoch: the samples already consumed (a checkpoint's LoaderState::position)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resumed-from", a.resumed_from,
                 "a resumed epoch: the processes of the job that saved the checkpoint "
                 "(whose rule drew the epoch's order with --shuffle)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--iterable", a.iterable, "an iterable dataset (IterableDatasetShard)");
  app.add_flag("--dispatch", a.dispatch, "loading::dispatched (rank 0 reads, every rank gets its slice)");
  app.add_flag("--json", a.as_json, "print JSON instead of a table");
  auto* golden =
      app.add_option("--golden", a.golden, "a golden file of Python Accelerate's vectors")->check(CLI::ExistingFile);
  auto* emit = app.add_flag("--emit", a.emit, "with --golden: write the library's results in the same schema");
  auto* check = app.add_flag("--check", a.check, "with --golden: compare and print 'N passed, M failed'");
  emit->needs(golden)->excludes(check);
  check->needs(golden);
  golden->excludes("--samples");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!a.golden.empty()) {
      if (!a.emit && !a.check) {
        std::cerr << "accel-plan: --golden needs --emit or --check\n";
        return 2;
      }
      return run_golden(a);
    }
    return run_plan(a);
  } catch (const accel::Error& e) {
    std::cerr << "accel-plan: " << e.what() << "\n";
    return 2;
  }
}
