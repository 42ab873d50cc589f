// Resuming at another number of processes (README, "Resuming at another world size"): plans that start at a global
// position, and prepared loaders of N simulated ranks stopped mid-epoch and resumed by M (sharded, split, uneven,
// a user's batch sampler, streams): every sample of the interrupted epoch exactly once, in the epoch's order, and
// the next epoch a fresh M-process job's.
#include "../support.hpp"

#include <ATen/Context.h>
#include <accel/data/loader.hpp>
#include <catch2/catch.hpp>

#include <optional>
#include <random>
#include <ranges>

namespace {
using namespace accel_test;
namespace data = accel::data;
namespace plan = accel::plan;

constexpr plan::Loading kLoadings[] = {plan::Loading::sharded, plan::Loading::iterable, plan::Loading::dispatched};

// The positions of a plan's batches, split into real ones (below n) and padding ones.
std::vector<std::int64_t> real_positions(const plan::BatchPlan& p, std::int64_t j) {
  std::vector<std::int64_t> out;
  const auto s = p.span(j);
  for (auto pos = s.begin; pos < s.begin + p.real(j); ++pos) out.push_back(pos);
  return out;
}

// [step][rank] -> the real samples of that rank's batch at that step.
using Steps = std::vector<std::vector<std::vector<std::int64_t>>>;
std::vector<std::int64_t> flatten(const Steps& steps) {
  std::vector<std::int64_t> out;
  for (const auto& step : steps)
    for (const auto& rank : step) out.insert(out.end(), rank.begin(), rank.end());
  return out;
}

// Takes `steps` steps (-1: the rest of the epoch) of every rank's loader, one rank after the other (no
// communicator: simulated ranks), recording each batch's real samples (GradientState's layout says how many).
template <class Loader>
void take(std::vector<Loader>& ranks, std::int64_t steps, Steps& out, std::vector<Batches>* whole = nullptr) {
  if (steps == 0) return;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::size_t j = 0;
    for (const auto& b : ranks[r]) {
      auto v = as_vector(b);
      if (whole) (*whole)[r].push_back(v);
      v.resize(std::size_t(accel::GradientState::instance().layout().real.at(r)));
      if (out.size() <= j) out.resize(j + 1, std::vector<std::vector<std::int64_t>>(ranks.size()));
      out[j][r] = std::move(v);
      if (std::int64_t(++j) == steps) break;
    }
  }
}

// `make(P, r)`: rank r of a P-process job's loader, freshly prepared after set_seed(42) (as every rank of a job
// is). A job of N processes runs epoch 0, then stops after k steps of epoch 1 at every k; M processes resume from
// rank 0's state.
template <class Make>
void check_resize(int N, int M, Make make, bool next_epoch_is_fresh) {
  auto job = [&](int P) {
    std::vector<decltype(make(1, 0))> ranks;
    for (int r = 0; r < P; ++r) ranks.push_back(make(P, r));
    return ranks;
  };
  auto run_epoch0 = [](auto& ranks) {
    Steps ignored;
    for (auto& l : ranks) l.set_epoch(0);
    take(ranks, -1, ignored);
    for (auto& l : ranks) l.set_epoch(1);
  };
  Steps whole;
  {
    auto ranks = job(N);
    run_epoch0(ranks);
    take(ranks, -1, whole);
  }
  const auto order = flatten(whole);
  // A fresh M-process job's epoch 2, every rank's batches (padding included).
  std::vector<Batches> fresh(std::size_t(M), Batches{});
  {
    auto ranks = job(M);
    run_epoch0(ranks);
    Steps ignored;
    take(ranks, -1, ignored);
    for (auto& l : ranks) l.set_epoch(2);
    take(ranks, -1, ignored, &fresh);
  }
  for (std::int64_t k = 0; k <= std::int64_t(whole.size()); ++k) {
    Steps before, after;
    data::LoaderState saved;
    {
      auto ranks = job(N);
      run_epoch0(ranks);
      take(ranks, k, before);
      saved = ranks[0].state_dict();
    }
    auto resumed = job(M);
    for (auto& l : resumed) l.load_state_dict(saved);
    INFO(N << " -> " << M << " processes, stopped after " << k << " of " << whole.size() << " steps (position "
           << saved.position << ")");
    REQUIRE(saved.processes == N);
    REQUIRE(resumed[0].epoch() == saved.epoch);
    if (saved.epoch == 1) take(resumed, -1, after);
    auto got = flatten(before);
    const auto rest = flatten(after);
    got.insert(got.end(), rest.begin(), rest.end());
    if (saved.position > 0) {
      REQUIRE(got == order);  // every sample of the epoch once, in the epoch's order
    } else {                  // an epoch not begun is the M-process job's own: every sample once
      auto a = got, b = order;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      REQUIRE(a == b);
    }
    if (!next_epoch_is_fresh) continue;
    std::vector<Batches> next(std::size_t(M), Batches{});
    Steps ignored;
    for (auto& l : resumed) l.set_epoch(2);
    take(resumed, -1, ignored, &next);
    REQUIRE(next == fresh);
  }
}

constexpr std::pair<int, int> kResizes[] = {{2, 3}, {3, 2}, {2, 1}, {1, 2}};

}  // namespace

TEST_CASE("a plan that starts at a step boundary is the plan without its first steps", "[plan][resize]") {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    auto s = random_spec(rng, true);
    const std::int64_t n = std::int64_t(rng() % 40);
    for (auto loading : kLoadings) {
      if (loading == plan::Loading::dispatched && !s.even_batches) continue;
      try {
        plan::validate(s, n, loading);
      } catch (const accel::InvalidArgument&) {
        continue;
      }
      const std::int64_t step = plan::per_step(s);
      for (int r = 0; r < s.num_processes; ++r) {
        auto spec = s;
        spec.process_index = r;
        const auto full = plan::loader_plan(spec, n, loading);
        for (std::int64_t k = 0; k <= full.size(); ++k) {
          const auto started = plan::loader_plan(spec, n, loading, std::min(n, k * step));
          INFO("n " << n << " B " << s.batch_size << " N " << s.num_processes << " r " << r << " split "
                    << s.split_batches << " even " << s.even_batches << " drop_last " << s.drop_last << " loading "
                    << int(loading) << " k " << k);
          const auto a = yield_of(started), b = yield_of(full.skip(k));
          REQUIRE(a.batches == b.batches);
          REQUIRE(a.real == b.real);
          for (std::int64_t j = 0; j < started.size(); ++j)
            REQUIRE(started.end_of_dataloader(j) == full.skip(k).end_of_dataloader(j));
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("plans resumed at another number of processes cover the rest of the epoch once, in order", "[plan][resize]") {
  int checked = 0;
  for (auto loading : kLoadings)
    for (auto [N, M] : kResizes)
      for (bool split : {false, true})
        for (bool even : {true, false})
          for (bool drop_last : {false, true})
            for (std::int64_t n : {0, 1, 5, 23, 36, 37})
              for (std::int64_t B : {1, 2, 3, 6}) {
                if (loading == plan::Loading::dispatched && !even) continue;
                if (split && (B % N != 0 || B % M != 0)) continue;
                auto spec = [&](int P, int r) {
                  return plan::ShardSpec{.batch_size = B,
                                         .drop_last = drop_last,
                                         .num_processes = P,
                                         .process_index = r,
                                         .split_batches = split,
                                         .even_batches = even};
                };
                // The N-process job: the positions of its first k steps, every rank; then M processes from there.
                std::vector<plan::BatchPlan> first;
                std::int64_t steps = 0;
                for (int r = 0; r < N; ++r) {
                  first.push_back(plan::loader_plan(spec(N, r), n, loading));
                  steps = std::max(steps, first.back().size());
                }
                for (std::int64_t k = 0; k <= steps; ++k) {
                  std::vector<std::int64_t> got;
                  for (std::int64_t j = 0; j < k; ++j)
                    for (const auto& p : first)
                      if (j < p.size())
                        for (auto x : real_positions(p, j)) got.push_back(x);
                  const std::int64_t position = std::min(n, k * plan::per_step(spec(N, 0)));
                  REQUIRE(got.size() == std::size_t(position));
                  std::vector<plan::BatchPlan> rest;
                  std::int64_t more = 0;
                  for (int r = 0; r < M; ++r) {
                    rest.push_back(plan::loader_plan(spec(M, r), n, loading, position));
                    more = std::max(more, rest.back().size());
                  }
                  for (std::int64_t j = 0; j < more; ++j)
                    for (const auto& p : rest)
                      if (j < p.size())
                        for (auto x : real_positions(p, j)) got.push_back(x);
                  INFO("loading " << int(loading) << " " << N << " -> " << M << " split " << split << " even " << even
                                  << " drop_last " << drop_last << " n " << n << " B " << B << " k " << k);
                  // Positions 0, 1, 2, ...: each once, in order; all of them unless drop_last drops the M-process tail.
                  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == std::int64_t(i));
                  if (!drop_last) REQUIRE(got.size() == std::size_t(n));
                  ++checked;
                }
              }
  CHECK(checked > 1000);
}

TEMPLATE_LIST_TEST_CASE("a sharded loader stopped mid-epoch resumes at another number of processes", "[loader][resize]",
                        ShardedMatrix) {
  using Config = TestType;
  for (auto [N, M] : kResizes)
    for (bool shuffle : {false, true})
      for (std::int64_t n : {23, 36}) {
        const std::int64_t B = Config::split_batches ? 6 : 4;
        const data::DataLoaderOptions opt{.batch_size = B, .shuffle = shuffle, .workers = n == 23 ? 0 : 2};
        auto make = [&](int P, int r) {
          at::manual_seed(42);
          return data::prepare_data_loader<Config>(data::DataLoader(indices(n), opt),
                                                   data::PrepareContext{P, r, nullptr});
        };
        // One process draws every epoch from the global generator (PyTorch's rule), which the job's own draws move on:
        // its next epoch follows the restored generator, not a fresh job's (README).
        check_resize(N, M, make, !(shuffle && M == 1));
      }
}

TEST_CASE("a shuffled loader with a seed or the seedable sampler: the next epoch is a fresh job's at every size",
          "[loader][resize]") {
  for (auto [N, M] : kResizes)
    for (bool seedable : {false, true}) {
      const data::DataLoaderOptions opt{.batch_size = 3,
                                        .shuffle = true,
                                        .seedable = seedable,
                                        .seed = seedable ? std::nullopt : std::optional<std::uint64_t>(11)};
      auto make = [&](int P, int r) {
        at::manual_seed(42);
        return data::prepare_data_loader<Even>(data::DataLoader(indices(29), opt), data::PrepareContext{P, r, nullptr});
      };
      check_resize(N, M, make, true);
    }
}

TEST_CASE("a user's batch sampler resumes at another number of processes, whole batches", "[loader][resize]") {
  for (auto [N, M] : kResizes) {
    const data::DataLoaderOptions opt{.batch_sampler = bucketed_batches};
    auto even = [&](int P, int r) {
      return data::prepare_data_loader<Even>(data::DataLoader(indices(31), opt), data::PrepareContext{P, r, nullptr});
    };
    check_resize(N, M, even, true);
    using Uneven = accel::CheckedConfig<accel::dist::gloo, accel::tail::uneven>;
    auto uneven = [&](int P, int r) {
      return data::prepare_data_loader<Uneven>(data::DataLoader(indices(31), opt), data::PrepareContext{P, r, nullptr});
    };
    check_resize(N, M, uneven, true);
  }
  // The closed form of a resumed shard is the shard without its first rounds at a round boundary.
  const auto batches = bucketed_batches(0);
  for (int N : {1, 2, 3, 5})
    for (bool even : {true, false})
      for (bool drop_last : {false, true})
        for (int r = 0; r < N; ++r) {
          const plan::ShardSpec spec{.batch_size = plan::varying,
                                     .drop_last = drop_last,
                                     .num_processes = N,
                                     .process_index = r,
                                     .even_batches = even};
          std::vector<data::ShardBatch> all;
          for (const auto& b : data::BatchSamplerShard(batches, spec)) all.push_back(b);
          for (std::size_t k = 1; k <= all.size(); ++k) {
            using Source = accel::pipeline::BatchSamplerSource<Indices, data::DefaultCollate, Even,
                                                               accel::pipeline::LocalTransport>;
            const auto from = Source::shard_from(
                batches, spec, std::min<std::int64_t>(std::int64_t(k) * N, std::int64_t(batches.size())));
            INFO("N " << N << " r " << r << " even " << even << " drop_last " << drop_last << " k " << k);
            const bool same = from == std::vector<data::ShardBatch>(all.begin() + std::ptrdiff_t(k), all.end());
            REQUIRE(same);
          }
        }
}

TEST_CASE("a stream resumes at another number of processes: the items it had not read", "[loader][resize][iterable]") {
  std::vector<std::int64_t> items(29);
  std::iota(items.begin(), items.end(), 0);
  for (auto [N, M] : kResizes) {
    auto per_process = [&](int P, int r) {
      data::DataLoader dl(std::views::all(items), {.batch_size = 3, .workers = r % 2});
      return data::prepare_data_loader<Even>(dl, data::PrepareContext{P, r, nullptr});
    };
    check_resize(N, M, per_process, true);
    auto split = [&](int P, int r) {
      data::DataLoader dl(std::views::all(items), {.batch_size = 6});
      return data::prepare_data_loader<Split>(dl, data::PrepareContext{P, r, nullptr});
    };
    check_resize(N, M, split, true);
  }
}

TEST_CASE("a loader state from another dataset, batch size or loading path is refused, naming what differs",
          "[loader][resize]") {
  const data::DataLoaderOptions opt{.batch_size = 4, .shuffle = true};
  auto saved_by = [&](std::int64_t n, std::int64_t batch) {
    auto l = data::prepare_data_loader<Even>(data::DataLoader(indices(n), {.batch_size = batch, .shuffle = true}),
                                             data::PrepareContext{2, 0, nullptr});
    for (const auto& b : l) {
      (void)b;
      break;
    }
    return l.state_dict();
  };
  auto loader =
      data::prepare_data_loader<Even>(data::DataLoader(indices(20), opt), data::PrepareContext{3, 1, nullptr});
  CHECK_THROWS_WITH(loader.load_state_dict(saved_by(23, 4)),
                    Catch::Contains("was saved for a dataset of 23 samples, this loader's has 20"));
  CHECK_THROWS_WITH(loader.load_state_dict(saved_by(20, 5)),
                    Catch::Contains("was saved with batch_size 5, this loader's is 4"));
  auto split = data::prepare_data_loader<Split>(data::DataLoader(indices(20), {.batch_size = 6}),
                                                data::PrepareContext{2, 0, nullptr});
  CHECK(split.state_mismatch(saved_by(20, 4)) ==
        "was saved under batches::per_process, this loader runs under batches::split");
  std::vector<std::int64_t> items(20);
  auto stream = data::prepare_data_loader<Even>(data::DataLoader(std::views::all(items), {.batch_size = 4}),
                                                data::PrepareContext{2, 0, nullptr});
  CHECK(stream.state_mismatch(saved_by(20, 4)) ==
        "was saved by loading::sharded, this loader uses an iterable dataset with loading::sharded");
  CHECK(loader.state_mismatch(saved_by(20, 4)).empty());
  // A state of checkpoint format 2 (no position, no description) resumes after its batches, as it always did.
  auto old = saved_by(20, 4);
  old = {.epoch = old.epoch, .batches = old.batches, .generator_state = old.generator_state};
  auto same = data::prepare_data_loader<Even>(data::DataLoader(indices(20), opt), data::PrepareContext{2, 0, nullptr});
  same.load_state_dict(old);
  CHECK(same.size() == 2);  // 3 batches of 4 per process, one taken
}

TEST_CASE("a loader state that no job reaches is refused, naming the field; every state a job saves is reachable",
          "[loader][resize]") {
  const data::DataLoaderOptions opt{.batch_size = 4, .shuffle = true};
  // The state after `steps` batches of a 2-process job over 20 samples (8 a step), and a loader of 3 processes.
  auto saved_after = [&](int steps) {
    auto l = data::prepare_data_loader<Even>(data::DataLoader(indices(20), opt), data::PrepareContext{2, 0, nullptr});
    int k = 0;
    for (const auto& b : l) {
      (void)b;
      if (++k == steps) break;
    }
    return l.state_dict();
  };
  auto loader =
      data::prepare_data_loader<Even>(data::DataLoader(indices(20), opt), data::PrepareContext{3, 1, nullptr});
  for (int steps = 1; steps <= 2; ++steps) CHECK(loader.state_unreachable(saved_after(steps)).empty());
  auto changed = [&](auto edit) {
    auto s = saved_after(1);  // position 8 after 1 batch
    edit(s);
    return loader.state_unreachable(s);
  };
  CHECK_THAT(changed([](auto& s) { s.position = 24; }),
             Catch::Contains("is at position 24, past the end of its epoch's 20 samples"));
  CHECK_THAT(changed([](auto& s) { s.position = 3; }),
             Catch::Contains("is at position 3, which no job of batch_size 4 reaches"));
  CHECK_THAT(changed([](auto& s) { s.batches = std::int64_t(1) << 40; }),
             Catch::Contains("after 1099511627776 batches; a job of 2 process(es) reaches it in 1 (8 a step)"));
  CHECK_THAT(changed([](auto& s) { s.batches = 0; }), Catch::Contains("reaches it in 1"));
  CHECK_THAT(changed([](auto& s) { s.generator_state.clear(); }),
             Catch::Contains("without a generator state, and this loader shuffles"));
  // The end of the epoch (a skip past it) is reachable with more batches; a resized job's position too.
  CHECK(changed([](auto& s) { s.position = 20, s.batches = 7; }).empty());
  CHECK(changed([](auto& s) { s.position = 12, s.batches = 1, s.processes = 3; }).empty());  // 12 samples a step
  CHECK_THROWS_WITH(loader.load_state_dict([&] {
    auto s = saved_after(1);
    s.position = 3;
    return s;
  }()),
                    Catch::Contains("position 3") && Catch::Contains("it is damaged, or not this loader's"));
}
