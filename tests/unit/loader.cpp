// Prepared loaders in one process: golden end-to-end vectors (ranks simulated, as Accelerate's own tests do),
// exact resume at every cut point, workers, GradientState, errors, range composition.
#include "support.hpp"

#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>

#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/data/datasets/base.h>
#include <catch2/catch.hpp>
#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>

#include <numeric>
#include <set>
#include <stdexcept>

namespace {
using Batches = std::vector<std::vector<std::int64_t>>;
using Indices = accel::data::RangeDataset<std::vector<std::int64_t>>;
namespace data = accel::data;

Indices indices(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return Indices(v);
}
std::vector<std::int64_t> as_vector(const at::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}
template <class Loader>
std::pair<Batches, std::vector<bool>> run_epoch(Loader& loader) {
  Batches out;
  std::vector<bool> ends;
  for (const auto& b : loader) {
    out.push_back(as_vector(b));
    ends.push_back(accel::GradientState::instance().end_of_dataloader());
  }
  return {out, ends};
}

template <class... P>
struct Cfg : accel::Accelerator<P...> {};
using Even = Cfg<accel::dist::gloo>::config;
using Uneven = Cfg<accel::dist::gloo, accel::tail::uneven>::config;
using Split = Cfg<accel::dist::gloo, accel::batches::split>::config;
using SplitUneven = Cfg<accel::dist::gloo, accel::batches::split, accel::tail::uneven>::config;

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

TEST_CASE("ShardedLoader reproduces Accelerate's end-to-end vectors", "[loader][golden]") {
  const auto file = accel_test::golden("dataloader_shard_e2e.json");
  std::size_t checked = 0, refused = 0;
  for (const auto& c : file.at("cases")) {
    const bool split = c.at("split_batches"), even = c.at("even_batches");
    if (c.contains("prepare_error")) {
      data::DataLoader dl(indices(c.at("n")), {.batch_size = c.at("batch_size")});
      CHECK_THROWS_WITH((data::prepare_data_loader<Split>(dl, data::PrepareContext{c.at("num_processes"), 0, nullptr})),
                        Catch::Contains("must be a round multiple of the number of processes"));
      ++refused;
      continue;
    }
    if (split && even) check_shard_case<Split>(c);
    else if (split) check_shard_case<SplitUneven>(c);
    else if (even) check_shard_case<Even>(c);
    else check_shard_case<Uneven>(c);
    ++checked;
  }
  CHECK(checked > 1000);
  CHECK(refused > 0);
  CHECK(accel::GradientState::instance().active_loaders() == 0);
}

TEST_CASE("resuming from a loader's state yields exactly the remaining batches, at every cut point", "[loader][resume]") {
  struct Setup {
    int N, rank, workers;
    bool shuffle, seedable, drop_last;
    std::int64_t n, batch;
  };
  const std::vector<Setup> setups{{1, 0, 0, true, false, false, 23, 4}, {1, 0, 2, true, false, true, 23, 4},
                                  {2, 1, 0, true, false, false, 21, 3}, {2, 0, 3, true, true, false, 17, 2},
                                  {3, 2, 1, false, false, false, 19, 4}, {1, 0, 0, true, true, false, 10, 3}};
  for (const auto& s : setups) {
    const data::DataLoaderOptions opt{.batch_size = s.batch, .shuffle = s.shuffle, .drop_last = s.drop_last,
                                      .workers = s.workers, .seedable = s.seedable, .data_seed = s.seedable ? std::optional<std::uint64_t>(7) : std::nullopt};
    auto make = [&](std::uint64_t seed) {
      at::manual_seed(seed);
      return data::prepare_data_loader<Even>(data::DataLoader(indices(s.n), opt), data::PrepareContext{s.N, s.rank, nullptr});
    };
    const int epochs = 3;
    Batches reference;
    {
      auto loader = make(42);
      for (int e = 0; e < epochs; ++e) {
        loader.set_epoch(e);
        for (auto& b : run_epoch(loader).first) reference.push_back(b);
      }
    }
    for (std::size_t cut = 0; cut <= reference.size(); ++cut) {
      Batches got;
      data::LoaderState saved;
      {
        auto first = make(42);
        std::size_t taken = 0;
        for (int e = 0; e < epochs && taken < cut; ++e) {
          first.set_epoch(e);
          for (const auto& b : first) {  // the loop is abandoned mid-epoch, with workers in flight
            got.push_back(as_vector(b));
            if (++taken == cut) break;
          }
        }
        saved = first.state_dict();
      }
      auto second = make(999);  // a fresh process: another global seed
      second.load_state_dict(saved);
      for (std::int64_t e = saved.epoch; e < epochs; ++e) {
        second.set_epoch(e);
        for (auto& b : run_epoch(second).first) got.push_back(b);
      }
      INFO("setup n=" << s.n << " N=" << s.N << " workers=" << s.workers << " shuffle=" << s.shuffle << " seedable=" << s.seedable
                      << " cut=" << cut);
      REQUIRE(got == reference);
    }
  }
  CHECK(accel::GradientState::instance().active_loaders() == 0);
}

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
    CHECK_THROWS_WITH(run_epoch(lb), Catch::Contains("rank 0: loading batch 4 of epoch 0 (first sample 16) failed: sample 17 is corrupt"));
  }
}

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

TEST_CASE("iterable datasets: every process reads the stream and keeps Accelerate's share, with and without workers", "[loader][iterable]") {
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
      auto run = [&]<class Config>(Config*) {
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
      };
      if (split) run(static_cast<Split*>(nullptr));
      else run(static_cast<Even*>(nullptr));
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
  CHECK((rest == Batches{{2, 3, 4}}));  // rank 1's second batch: the last chunk [6, 0, 1, 2, 3, 4] padded from the first
  CHECK(!accel::GradientState::instance().in_dataloader());
}

namespace {
// A LibTorch dataset, as users of torch::data write them (MNIST has the same shape).
struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(size_t i) override {
    return {at::full({2}, double(i * i)), at::scalar_tensor(std::int64_t(i), at::kLong)};
  }
  torch::optional<size_t> size() const override { return 9; }
};
}  // namespace

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

TEST_CASE("repeated resumes: stop, resume, stop again, resume again", "[loader][resume]") {
  const data::DataLoaderOptions opt{.batch_size = 3, .shuffle = true, .workers = 2};
  auto make = [&](std::uint64_t seed) {
    at::manual_seed(seed);
    return data::prepare_data_loader<Even>(data::DataLoader(indices(31), opt), data::PrepareContext{2, 0, nullptr});
  };
  Batches reference;
  {
    auto l = make(5);
    for (int e = 0; e < 3; ++e) for (auto& b : run_epoch(l).first) reference.push_back(b);
  }
  for (std::size_t step : {1u, 2u, 5u, 7u}) {
    Batches got;
    data::LoaderState state{};
    bool first = true;
    std::uint64_t seed = 5;
    while (got.size() < reference.size()) {
      auto l = make(seed);
      seed += 1000;  // every "process" starts from another global seed
      if (!first) l.load_state_dict(state);
      first = false;
      std::size_t taken = 0;
      bool stopped = false;
      for (std::int64_t e = l.epoch(); e < 3 && !stopped; ++e) {
        l.set_epoch(e);
        for (const auto& b : l) {
          got.push_back(as_vector(b));
          if (++taken == step) {
            stopped = true;
            break;
          }
        }
      }
      state = l.state_dict();
      if (!stopped) break;
    }
    INFO("a resume every " << step << " batches");
    CHECK(got == reference);
  }
}

TEST_CASE("an explicit sampler seed fixes the order whatever the global seed", "[loader][shuffle]") {
  auto epoch_of = [](std::uint64_t global, int N) {
    at::manual_seed(global);
    data::DataLoader dl(indices(20), {.batch_size = 20, .shuffle = true, .seed = 77});
    auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{N, 0, nullptr});
    return run_epoch(l).first;
  };
  CHECK(epoch_of(1, 1) == epoch_of(2, 1));
  CHECK(epoch_of(1, 2) == epoch_of(3, 2));
  const auto direct = data::RandomSampler(20, data::make_generator(77)).next_epoch();
  CHECK(epoch_of(9, 1).front().front() == direct[0]);  // the generator PyTorch's DataLoader(generator=g) would use
}

TEST_CASE("samplers and batch samplers of the user's", "[loader][sampler]") {
  // A sampler: any order, any length (here a subset, reversed, different every epoch).
  data::DataLoaderOptions opt{.batch_size = 2};
  opt.sampler = [](std::int64_t epoch) {
    std::vector<std::int64_t> v;
    for (std::int64_t i = 9; i >= 0; i -= 2) v.push_back(i - epoch);
    return v;
  };
  auto sampled = data::prepare_data_loader<Even>(data::DataLoader(indices(10), opt), data::PrepareContext{2, 0, nullptr});
  CHECK((run_epoch(sampled).first == Batches{{9, 7}, {1, 9}}));  // rank 0 of 2: batches 0 and 2; the tail padded
  CHECK((run_epoch(sampled).first == Batches{{8, 6}, {0, 8}}));  // epoch 1
  // A batch sampler with varying batch sizes: Accelerate's own expectations, through the loader.
  const auto file = accel_test::golden("accelerate_tests_expectations.json");
  int checked = 0;
  for (const auto& e : file.at("entries")) {
    if (e.at("kind") != "batch_sampler_shard_varying") continue;
    const auto in = e.at("batches_in").get<Batches>();
    std::int64_t n = 0;
    for (const auto& b : in) for (auto i : b) n = std::max(n, i + 1);
    data::DataLoaderOptions bo{.drop_last = e.at("drop_last")};
    bo.batch_sampler = [in](std::int64_t) { return in; };
    const int N = e.at("num_processes");
    for (int r = 0; r < N; ++r) {
      auto run = [&]<class Config>(Config*) {
        auto l = data::prepare_data_loader<Config>(data::DataLoader(indices(n), bo), data::PrepareContext{N, r, nullptr});
        CHECK(l.size() == e.at("expected")[std::size_t(r)].size());
        auto [got, ends] = run_epoch(l);
        INFO(e.at("source").get<std::string>() << " rank " << r);
        CHECK(got == e.at("expected")[std::size_t(r)].get<Batches>());
        if (!ends.empty()) CHECK(ends.back());
      };
      if (e.at("even_batches").get<bool>()) run(static_cast<Even*>(nullptr));
      else run(static_cast<Uneven*>(nullptr));
    }
    ++checked;
  }
  CHECK(checked == 8);
  data::DataLoaderOptions both{.batch_size = 2};
  both.sampler = [](std::int64_t) { return std::vector<std::int64_t>{0}; };
  both.batch_sampler = [](std::int64_t) { return Batches{{0}}; };
  CHECK_THROWS_WITH(data::prepare_data_loader<Even>(data::DataLoader(indices(4), both), data::PrepareContext{}),
                    Catch::Contains("give a sampler or a batch_sampler, not both"));
  data::DataLoaderOptions split{.batch_size = 2};
  split.batch_sampler = [](std::int64_t) { return Batches{{0, 1}}; };
  CHECK_THROWS_WITH(data::prepare_data_loader<Split>(data::DataLoader(indices(4), split), data::PrepareContext{2, 0, nullptr}),
                    Catch::Contains("batches::split needs a fixed batch size"));
  data::DataLoaderOptions bad{.batch_size = 2};
  bad.sampler = [](std::int64_t) { return std::vector<std::int64_t>{0, 7}; };
  auto lb = data::prepare_data_loader<Even>(data::DataLoader(indices(4), bad), data::PrepareContext{});
  CHECK_THROWS_WITH(run_epoch(lb), Catch::Contains("returned index 7, outside the dataset's 4 samples"));
}

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

TEST_CASE("bad input to loaders is a clear error", "[loader][errors]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(data::DataLoader(indices(4), {.batch_size = 0}), Contains("batch_size must be at least 1 (got 0)"));
  data::DataLoader dl(indices(10), {.batch_size = 3});
  CHECK_THROWS_WITH(data::prepare_data_loader<Split>(dl, data::PrepareContext{2, 0, nullptr}),
                    Contains("under batches::split the batch size (3) must be a round multiple of the number of processes (2)"));
  CHECK_THROWS_WITH(data::prepare_data_loader<Even>(dl, data::PrepareContext{2, 2, nullptr}),
                    Contains("process_index 2 is out of range for 2 processes"));
  struct Ragged {
    std::int64_t size() const { return 4; }
    at::Tensor get(std::int64_t i) const { return at::arange(i + 1); }
  };
  auto ragged = data::prepare_data_loader<Even>(data::DataLoader(Ragged{}, {.batch_size = 2}), data::PrepareContext{});
  CHECK_THROWS_WITH(run_epoch(ragged), Contains("loading batch 0 of epoch 0 (first sample 0) failed: stack expects each tensor to be equal size"));
  CHECK_THROWS_WITH(data::TensorDataset(at::arange(4), at::arange(3)), Contains("must have the same first dimension (got 4 and 3)"));
  auto l = data::prepare_data_loader<Even>(dl, data::PrepareContext{});
  CHECK_THROWS_WITH(l.skip_first_batches(-1), Contains("cannot skip a negative number of batches (-1)"));
}

TEST_CASE("loaders are ranges: std::views and range-v3 compose; tensor datasets gather whole batches", "[loader][ranges]") {
  data::DataLoader dl(data::TensorDataset(at::arange(20).reshape({10, 2}), at::arange(10)), {.batch_size = 4});
  auto loader = data::prepare_data_loader<Even>(dl, data::PrepareContext{2, 1, nullptr});
  STATIC_REQUIRE(std::ranges::input_range<decltype(loader)>);
  STATIC_REQUIRE(std::ranges::view<decltype(loader)>);
  STATIC_REQUIRE(ranges::input_range<decltype(loader)>);
  std::vector<std::int64_t> firsts;
  using Example = data::TensorDataset::Example;
  for (auto t : loader | std::views::take(5) | std::views::transform([](const Example& b) { return b.target[0].item<std::int64_t>(); }))
    firsts.push_back(t);
  CHECK((firsts == std::vector<std::int64_t>{4, 2}));  // rank 1 of 2: batch 1 = [4..7], then the padded [2,3,0,1]
  std::vector<std::pair<std::size_t, std::int64_t>> en;
  for (auto [i, t] : loader | ranges::views::take(2) | ranges::views::transform([](const Example& b) { return b.data.size(0); }) |
                         ranges::views::enumerate)
    en.emplace_back(i, t);
  CHECK((en == std::vector<std::pair<std::size_t, std::int64_t>>{{0, 4}, {1, 4}}));
  CHECK(loader.total_batch_size() == 8);
  CHECK(loader.total_dataset_length() == 10);
  auto skipped = loader.skip_first_batches(1);
  CHECK(skipped.size() == 1);
  CHECK(as_vector((*skipped.begin()).target) == std::vector<std::int64_t>{2, 3, 4, 5});
}
