// Multi-process tests: started by accel-launch (or torchrun) as N real processes on 127.0.0.1, each checks
// every collective value by value. Modes:
//   collectives        everything in ProcessState and comm/, on every rank
//   kill               the last rank SIGKILLs itself in the middle of a series of all_reduces
//   training           the Accelerator: prepare + accumulate + backward equal one process on the concatenated
//                      batches; the scheduler's steps; the GradScaler skips everywhere when one rank overflows
//   train-kill         the last rank SIGKILLs itself in the middle of a training loop (inside forward/backward)
//   rendezvous         just connect (used to start a job one process short)
// Each rank ends with "rank R: N passed, M failed" and exits non-zero on any failure.
#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/plan/plan.hpp>
#include <accel/state/process_state.hpp>
#include <accel/accelerator.hpp>
#include <accel/data/loader.hpp>
#include <accel/model/distributed_module.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>

namespace {

int passed = 0, failed = 0, rank_ = 0;

void check(bool ok, const std::string& what) {
  if (ok) ++passed;
  else {
    ++failed;
    std::cerr << "FAILED on rank " << rank_ << ": " << what << std::endl;
  }
}
at::Tensor T(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor F(std::vector<float> v) { return at::tensor(v, at::kFloat); }
bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b); }

struct Batch {
  at::Tensor data, target;
};
auto accel_fields(Batch& b) { return std::tie(b.data, b.target); }
auto accel_fields(const Batch& b) { return std::tie(b.data, b.target); }

struct Metrics {
  std::string name;
  std::vector<double> values;
  std::map<std::string, int> counts;
};
auto accel_fields(Metrics& m) { return std::tie(m.name, m.values, m.counts); }
auto accel_fields(const Metrics& m) { return std::tie(m.name, m.values, m.counts); }

accel::ProcessOptions options(int timeout_ms) {
  accel::ProcessOptions o;
  o.comm.timeout = std::chrono::milliseconds(timeout_ms);
  o.comm.rendezvous_timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

void collectives(const std::string& scratch) {
  accel::ProcessState state(options(30000));
  const int N = state.num_processes(), r = state.process_index();
  rank_ = r;
  auto* comm = state.comm();
  check(N >= 2 && comm != nullptr, "several processes and a communicator");
  check(state.distributed_type() == accel::DistributedType::multi_cpu, "no GPU: the CPU engine without a flag");
  check(state.is_main_process() == (r == 0) && state.is_last_process() == (r == N - 1), "main/last predicates");
  check(state.device().is_cpu(), "device cpu");
  accel::ProcessState again;  // the first construction wins
  check(again.comm() == comm, "ProcessState is shared");

  // gather: rank order, 0-dim becomes 1-dim, nested structures, described structs.
  check(same(accel::gather(comm, T({r, r})), [&] { std::vector<int64_t> v; for (int i = 0; i < N; ++i) v.insert(v.end(), {i, i}); return T(v); }()),
        "gather 1-d");
  check(same(accel::gather(comm, at::scalar_tensor(r, at::kLong)), at::arange(N, at::kLong)), "gather of 0-dim tensors");
  auto two_d = accel::gather(comm, at::full({1, 2}, r, at::kFloat));
  check(two_d.sizes() == at::IntArrayRef({N, 2}) && two_d[N - 1][1].item<float>() == float(N - 1), "gather 2-d");
  Batch b{T({r}), F({float(r) / 2})};
  auto gb = accel::gather(comm, b);
  check(same(gb.data, at::arange(N, at::kLong)) && gb.target[N - 1].item<float>() == float(N - 1) / 2, "gather of a described struct");
  check(b.data.item<int64_t>() == r, "gather does not modify its input");
  std::map<std::string, std::tuple<at::Tensor, std::vector<at::Tensor>>> nested{{"x", {T({r}), {T({10 * r}), T({-r})}}}};
  auto gn = accel::gather(comm, nested);
  check(same(std::get<1>(gn.at("x"))[1], -at::arange(N, at::kLong)), "gather of map/tuple/vector");

  // broadcast from the last rank, in place.
  auto bx = T({r, 100 + r});
  accel::broadcast(comm, bx, N - 1);
  check(same(bx, T({N - 1, 100 + N - 1})), "broadcast from the last rank");

  // reduce: sum, mean, max, min; mean of an integer tensor is refused; the input is unchanged.
  auto x = F({float(r + 1)});
  check(accel::reduce(comm, x, accel::Reduction::sum).item<float>() == float(N * (N + 1) / 2), "reduce sum");
  check(accel::reduce(comm, x, accel::Reduction::mean).item<float>() == float(N + 1) / 2, "reduce mean");
  check(accel::reduce(comm, x, accel::Reduction::max).item<float>() == float(N), "reduce max");
  check(accel::reduce(comm, x, accel::Reduction::min).item<float>() == 1.0f, "reduce min");
  check(x.item<float>() == float(r + 1), "reduce does not modify its input");
  bool refused = false;
  try {
    (void)accel::reduce(comm, T({r}), accel::Reduction::mean);
  } catch (const accel::InvalidArgument& e) {
    refused = std::string(e.what()).find("mean of an integer tensor (Long) would truncate") != std::string::npos;
  }
  check(refused, "mean of an integer tensor is a clear error");
  check(accel::reduce(comm, T({r}), accel::Reduction::sum).item<int64_t>() == int64_t(N * (N - 1) / 2), "integer sum");

  // pad_across_processes: arange(r+1) padded with -1 to N, at the end or the start; out-of-range dim.
  auto mine = at::arange(r + 1, at::kLong);
  auto padded = accel::pad_across_processes(comm, mine, 0, -1);
  std::vector<int64_t> want;
  for (int i = 0; i < N; ++i) want.push_back(i <= r ? i : -1);
  check(same(padded, T(want)), "pad_across_processes");
  auto first = accel::pad_across_processes(comm, mine, 0, -1, /*pad_first=*/true);
  std::vector<int64_t> want_first;
  for (int i = 0; i < N - r - 1; ++i) want_first.push_back(-1);
  for (int i = 0; i <= r; ++i) want_first.push_back(i);
  check(same(first, T(want_first)), "pad_across_processes pad_first");
  check(same(accel::pad_across_processes(comm, mine, 3), mine), "pad_across_processes with a dim out of range");
  auto mat = at::full({2, r + 1}, r, at::kFloat);
  check(accel::pad_across_processes(comm, mat, -1).sizes() == at::IntArrayRef({2, N}), "pad_across_processes negative dim");

  // gather_for_metrics with the plan's layout: n=10 samples, batch 3, even tail (padding on the last batch),
  // then an uneven tail (different batch sizes per rank).
  for (bool even : {true, false}) {
    const int64_t n = 10;
    const accel::plan::ShardSpec base{.batch_size = 3, .num_processes = N, .even_batches = even};
    std::vector<accel::plan::BatchPlan> plans;
    for (int q = 0; q < N; ++q) {
      auto s = base;
      s.process_index = q;
      plans.push_back(accel::plan::loader_plan(s, n, accel::plan::Loading::sharded));
    }
    std::vector<int64_t> seen;
    for (int64_t j = 0; j < plans[0].size(); ++j) {
      accel::GatherLayout layout;
      bool everyone = true;
      for (const auto& p : plans) everyone &= j < p.size();
      if (!everyone) break;  // an uneven tail: not every rank has batch j (Accelerate: join_uneven_inputs)
      for (const auto& p : plans) layout.size.push_back(p.span(j).size()), layout.real.push_back(p.real(j));
      const auto& mine_plan = plans[std::size_t(r)];
      std::vector<int64_t> idx;
      for (auto pos = mine_plan.span(j).begin; pos < mine_plan.span(j).end; ++pos) idx.push_back(mine_plan.sample(pos));
      auto g = accel::gather_for_metrics(comm, T(idx), layout);
      for (int64_t i = 0; i < g.size(0); ++i) seen.push_back(g[i].item<int64_t>());
    }
    if (even) {
      std::vector<int64_t> all(n);
      for (int64_t i = 0; i < n; ++i) all[std::size_t(i)] = i;
      std::sort(seen.begin(), seen.end());
      check(seen == all, "gather_for_metrics returns every sample exactly once (even tail)");
    } else {
      std::set<int64_t> unique(seen.begin(), seen.end());
      check(unique.size() == seen.size(), "gather_for_metrics keeps no duplicate (uneven tail)");
    }
  }
  {  // ranks holding different numbers of rows in one batch
    accel::GatherLayout layout;
    for (int q = 0; q < N; ++q) layout.size.push_back(q + 1), layout.real.push_back(q == 0 ? 1 : q);
    auto g = accel::gather_for_metrics(comm, at::full({r + 1}, r, at::kLong), layout);
    std::vector<int64_t> w{0};
    for (int q = 1; q < N; ++q) for (int i = 0; i < q; ++i) w.push_back(q);
    check(same(g, T(w)), "gather_for_metrics with different sizes per rank");
  }

  // Objects: typed serialisation.
  Metrics m{"rank" + std::to_string(r), {1.5 * r, 2.0}, {{"a", r}, {"b", 7}}};
  auto mb = accel::broadcast_object(comm, m, 1);
  check(mb.name == "rank1" && mb.values == std::vector<double>{1.5, 2.0} && mb.counts.at("a") == 1, "broadcast_object of a struct");
  auto all = accel::gather_object(comm, std::string(std::size_t(r + 1), char('a' + r)));
  bool ok = int(all.size()) == N;
  for (int q = 0; ok && q < N; ++q) ok = all[std::size_t(q)] == std::string(std::size_t(q + 1), char('a' + q));
  check(ok, "gather_object of strings of different lengths");

  // split_between_processes: 7 items; padding; tensors; maps; the input is never modified.
  std::vector<int> items{0, 1, 2, 3, 4, 5, 6};
  auto share = state.split_between_processes(items);
  const int q7 = 7 / N, e7 = 7 % N, start = r * q7 + std::min(r, e7);
  std::vector<int> expect(items.begin() + start, items.begin() + start + q7 + (r < e7 ? 1 : 0));
  check(share == expect, "split_between_processes");
  auto pshare = state.split_between_processes(items, true);
  check(int(pshare.size()) == (7 + N - 1) / N && (pshare.size() == expect.size() || pshare.back() == 6), "split with padding");
  auto tshare = state.split_between_processes(at::arange(7, at::kLong), true);
  check(tshare.size(0) == (7 + N - 1) / N, "tensor split with padding");
  std::map<std::string, std::vector<int>> dict{{"a", items}, {"b", items}};
  auto dshare = state.split_between_processes(dict);
  check(dshare.at("b") == expect && dict.at("a").size() == 7, "map split leaves the input intact");

  // main_process_first: the main process's line is first in the file.
  const std::string file = scratch + "/first.txt";
  if (state.is_main_process()) {  // a fresh file for this run
    std::filesystem::create_directories(scratch);
    std::filesystem::remove(file);
  }
  state.wait_for_everyone();
  {
    auto first_guard = state.main_process_first();
    std::ofstream(file, std::ios::app) << r << "\n";
  }
  state.wait_for_everyone();
  std::ifstream in(file);
  std::string line0;
  std::getline(in, line0);
  int lines = 1;
  for (std::string l; std::getline(in, l);) ++lines;
  check(line0 == "0" && lines == N, "main_process_first: main ran first");

  // RNG: different seeds per rank, synchronised to rank 0's.
  accel::set_seed(1000, r, /*device_specific=*/true);
  accel::synchronize_rng_states<accel::rng::sync<accel::rng::torch>>(comm);
  auto draw = at::rand({4});
  check(same(accel::gather(comm, draw).narrow(0, 0, 4), accel::gather(comm, draw).narrow(0, 4 * (N - 1), 4)),
        "torch RNG synchronised");
  std::optional<at::Generator> gen = at::make_generator<at::CPUGeneratorImpl>(5 + r);
  accel::synchronize_rng_states<accel::rng::sync<accel::rng::generator>>(comm, gen);
  auto g0 = at::rand({3}, *gen);
  auto gg = accel::gather(comm, g0);
  check(same(gg.narrow(0, 0, 3), gg.narrow(0, 3 * (N - 1), 3)), "loader generator synchronised");
  accel::set_seed(1000, r, /*device_specific=*/true);
  auto d = accel::gather(comm, at::rand({2}));
  check(!same(d.narrow(0, 0, 2), d.narrow(0, 2, 2)), "device_specific seeds differ");

  state.print("collectives on ", N, " processes: checked");  // local main only
  state.wait_for_everyone();
}

// The end-to-end golden files of Python Accelerate, reproduced by real processes: every case whose world size
// is this job's, batch by batch and end_of_dataloader flag by flag, sharded or dispatched.
template <class... P>
struct Cfg : accel::Accelerator<P...> {};
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

int golden_workers_ = 0;  // loader workers for the golden runs (every loading path has them)

template <class Config>
void golden_case(const nlohmann::json& c, const accel::ProcessState& state, bool stream) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(c.at("n").get<std::int64_t>()));
  std::iota(v.begin(), v.end(), 0);
  const accel::data::DataLoaderOptions opt{.batch_size = c.at("batch_size"), .drop_last = c.at("drop_last"),
                                           .workers = golden_workers_, .prefetch = 3};
  if (stream) {  // the same samples as an iterable dataset (a stream: no get(i))
    accel::data::DataLoader dl(std::views::all(v), opt);
    golden_run(c, state, accel::data::prepare_data_loader<Config>(dl, state));
  } else {
    accel::data::DataLoader dl(accel::data::RangeDataset<std::vector<std::int64_t>>(v), opt);
    golden_run(c, state, accel::data::prepare_data_loader<Config>(dl, state));
  }
}


void golden(const std::string& path, bool stream) {
  accel::ProcessState state(options(30000));
  rank_ = state.process_index();
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
        accel::data::DataLoader dl(accel::data::RangeDataset<std::vector<std::int64_t>>(std::vector<std::int64_t>(1)), {.batch_size = bs});
        (void)accel::data::prepare_data_loader<Cfg<accel::dist::gloo, accel::batches::split>::config>(dl, state);
      } catch (const accel::InvalidArgument&) {
        threw = true;
      }
      check(threw, "split with an indivisible batch size is refused");
      ++refused;
      continue;
    }
    if (dispatch) {
      if (split) golden_case<Cfg<accel::dist::gloo, accel::loading::dispatched, accel::batches::split>::config>(c, state, stream);
      else golden_case<Cfg<accel::dist::gloo, accel::loading::dispatched>::config>(c, state, stream);
    } else if (split && even) golden_case<Cfg<accel::dist::gloo, accel::batches::split>::config>(c, state, false);
    else if (split) golden_case<Cfg<accel::dist::gloo, accel::batches::split, accel::tail::uneven>::config>(c, state, false);
    else if (even) golden_case<Cfg<accel::dist::gloo>::config>(c, state, false);
    else golden_case<Cfg<accel::dist::gloo, accel::tail::uneven>::config>(c, state, false);
  }
  state.print(stream ? "stream " : "", "golden ", path.substr(path.find_last_of('/') + 1), " on ", state.num_processes(), " processes, ",
              golden_workers_, " worker(s): ", refused, " configurations refused on purpose");
}

// A batch with a non-tensor field, for dispatched loading with a slice function.
struct Named {
  at::Tensor x;
  std::vector<std::string> names;
};
auto accel_fields(Named& n) { return std::tie(n.x, n.names); }
auto accel_fields(const Named& n) { return std::tie(n.x, n.names); }

// Dispatched loading's transport and errors: every rank receives only its slice (<= 1/N of a broadcast of the
// global batch), and a batch that rank 0 cannot build stops every rank with the same message.
void dispatch_checks() {
  accel::ProcessState state(options(30000));
  rank_ = state.process_index();
  const int N = state.num_processes();
  using Dispatch = Cfg<accel::dist::gloo, accel::loading::dispatched>::config;
  accel::data::DataLoader dl(accel::data::TensorDataset(at::rand({4096, 32}), at::arange(4096)), {.batch_size = 64, .shuffle = true});
  auto loader = accel::data::prepare_data_loader<Dispatch>(dl, state);
  std::int64_t rows = 0;
  for (const auto& b : loader) {
    (void)b;
    rows += accel::GradientState::instance().layout().real[std::size_t(rank_)];  // padding rows excluded
  }
  const auto [received, broadcast] = loader.transport_bytes();
  const double ratio = double(received) / double(broadcast);
  check(ratio <= 1.0 / N + 1e-9, "dispatched loading receives at most 1/N of a broadcast");
  check(accel::reduce(state.comm(), at::scalar_tensor(rows, at::kLong), accel::Reduction::sum).item<std::int64_t>() == 4096,
        "the ranks' rows add up to the dataset");
  state.print("dispatch transport: rank 0 received ", received, " bytes, a broadcast of every global batch would send ",
              broadcast, " (ratio ", ratio, " for ", N, " processes)");
  // scatter_object: any serialisable value per rank, tensors included.
  std::vector<std::tuple<std::string, at::Tensor>> parts;
  for (int q = 0; q < N; ++q) parts.emplace_back(std::string(std::size_t(q + 1), 'x'), at::full({q + 1}, q, at::kLong));
  auto got = accel::scatter_object(state.comm(), parts, 0);
  check(std::get<0>(got) == std::string(std::size_t(rank_ + 1), 'x') && at::equal(std::get<1>(got), at::full({rank_ + 1}, rank_, at::kLong)),
        "scatter_object");
  // A slice function: batches with strings, cut by rank 0 and sent to each rank serialised.
  auto collate_named = [](const std::vector<std::int64_t>& ids) {
    Named n{at::tensor(ids, at::kLong), {}};
    for (auto i : ids) n.names.push_back("sample-" + std::to_string(i));
    return n;
  };
  auto slice = [](const Named& g, std::int64_t begin, std::int64_t size) {
    return Named{g.x.narrow(0, begin, size), std::vector<std::string>(g.names.begin() + begin, g.names.begin() + begin + size)};
  };
  std::vector<std::int64_t> ids(26);
  std::iota(ids.begin(), ids.end(), 0);
  accel::data::DataLoader named(accel::data::RangeDataset<std::vector<std::int64_t>>(ids), {.batch_size = 4}, collate_named);
  auto nl = accel::data::prepare_data_loader<Dispatch>(named, state, slice);
  bool consistent = true;
  std::int64_t real_rows = 0;
  for (const auto& b : nl) {
    consistent &= std::int64_t(b.names.size()) == b.x.size(0);
    for (std::int64_t i = 0; i < b.x.size(0); ++i) consistent &= b.names[std::size_t(i)] == "sample-" + std::to_string(b.x[i].item<std::int64_t>());
    real_rows += accel::GradientState::instance().layout().real[std::size_t(rank_)];
  }
  check(consistent, "a slice function sends every rank its rows and their names");
  check(accel::reduce(state.comm(), at::scalar_tensor(real_rows, at::kLong), accel::Reduction::sum).item<std::int64_t>() == 26,
        "with a slice function the real rows still add up to the dataset");
  struct Ragged {
    std::int64_t size() const { return 64; }
    at::Tensor get(std::int64_t i) const { return at::arange(i < 40 ? 3 : 4); }
  };
  accel::data::DataLoader bad(Ragged{}, {.batch_size = 8});
  auto bl = accel::data::prepare_data_loader<Dispatch>(bad, state);
  std::string message;
  try {
    for (const auto& b : bl) (void)b;
  } catch (const accel::Error& e) {
    message = e.what();
  }
  const std::string step = std::to_string(40 / (8 * N));  // the step whose samples change size
  check(message.find("loading batch " + step + " of epoch 0") != std::string::npos &&
            message.find("failed: stack expects each tensor to be equal size") != std::string::npos,
        "a batch rank 0 cannot collate stops every rank with its message (got: " + message + ")");
}

// DistributedModule: N processes with per-process batches end with the same parameters as one process trained
// on the concatenated batches; k accumulation steps (no_sync) equal one step on k times the data; a parameter
// without gradient is named.
void ddp_checks() {
  accel::ProcessState state(options(30000));
  rank_ = state.process_index();
  const int N = state.num_processes();
  const std::int64_t B = 4;
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4)).ptr();
  };
  at::manual_seed(100 + rank_);  // different initial weights on every rank: rank 0's are broadcast
  auto net = make();
  accel::DistributedModule ddp(net, state.comm(), {.bucket_bytes = 256});  // several buckets
  check(ddp.buckets() > 1, "several gradient buckets");
  auto reference = make();
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD opt(net->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
  at::manual_seed(7);  // the same data on every rank
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = at::randn({2 * N * B, 8}), y = at::randn({2 * N * B, 4});
    // accel: two micro-batches per rank, the first one without sync, losses divided by the accumulation steps.
    opt.zero_grad();
    for (int micro = 0; micro < 2; ++micro) {
      const auto rows = x.narrow(0, (micro * N + rank_) * B, B), target = y.narrow(0, (micro * N + rank_) * B, B);
      auto loss = torch::mse_loss(net->forward(rows), target) / 2;
      if (micro == 0) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    opt.step();
    // reference: one process, one step on all 2*N*B rows.
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
  double worst = 0;
  auto a = net->parameters(), b = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  check(worst < 1e-5, "parameters equal single-process training on the concatenated batches (max diff " + std::to_string(worst) + ")");
  state.print("DistributedModule on ", N, " processes: max parameter difference to one process ", worst);
  // A parameter that gets no gradient.
  struct TwoHeads : torch::nn::Module {
    TwoHeads() : used(register_module("used", torch::nn::Linear(4, 1))), unused(register_module("unused", torch::nn::Linear(4, 1))) {}
    torch::nn::Linear used, unused;
  };
  auto heads = std::make_shared<TwoHeads>();
  accel::DistributedModule dh(heads, state.comm());
  std::string message;
  try {
    heads->used->forward(at::randn({2, 4})).sum().backward();
  } catch (const std::exception& e) {
    message = e.what();
  }
  check(message.find("parameter(s) unused.weight, unused.bias received no gradient") != std::string::npos,
        "a parameter without gradient is named (got: " + message.substr(0, 200) + ")");
}

struct Trainer : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};

void training_checks() {
  Trainer acc{accel::Options{.gradient_accumulation_steps = 2, .bucket_bytes = 256,
                             .comm = {.timeout = std::chrono::seconds(30), .rendezvous_timeout = std::chrono::seconds(30)}}};
  rank_ = acc.process_index();
  const int N = acc.num_processes();
  const std::int64_t B = 3, steps = 4;  // 4 optimizer steps of 2 micro-batches of B rows per process
  auto make = [] { return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)); };
  at::manual_seed(7);
  const at::Tensor x = at::randn({steps * 2 * N * B, 5}), y = at::randn({steps * 2 * N * B, 2});
  at::manual_seed(100 + rank_);  // different initial weights on every rank: prepare broadcasts rank 0's
  auto net = make();
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.2));
  auto [model, opt, loader, sched] = acc.prepare(net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}),
                                                 std::make_shared<torch::optim::StepLR>(*sgd, 1000));
  check(model.distributed().buckets() > 1, "several gradient buckets");
  auto reference = make();  // one process: the same start, one step on each 2*N*B consecutive rows
  {
    torch::NoGradGuard g;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::SGD ref_opt(reference->parameters(), 0.2);
  for (std::int64_t s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x.narrow(0, s * 2 * N * B, 2 * N * B)), y.narrow(0, s * 2 * N * B, 2 * N * B)).backward();
    ref_opt.step();
  }
  int real_steps = 0;
  for (const auto& b : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    real_steps += acc.sync_gradients();
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  check(real_steps == steps, "one real optimizer step every 2 batches (" + std::to_string(real_steps) + ")");
  check(sched.steps() == steps * N, "the scheduler steps num_processes times per optimizer step");
  double worst = 0;
  auto a = net->parameters(), r = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - r[i]).abs().max().item<double>());
  check(worst < 1e-5, "prepare + accumulate + backward equal one process on the concatenated batches (max diff " + std::to_string(worst) + ")");
  acc.print("Accelerator on ", N, " processes, 2-step accumulation: max parameter difference to one process ", worst);

  // The GradScaler's overflow finding is shared: one rank's inf skips the step on every rank.
  at::Tensor w = at::zeros({2}).set_requires_grad(true);
  auto plain = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(1.0));
  auto scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU), acc.comm(), accel::GradScalerOptions{.init_scale = 8.0});
  accel::AcceleratedOptimizer<torch::optim::SGD> scaled(plain, scaler);
  for (int round = 0; round < 2; ++round) {
    const float g = round == 0 && rank_ == N - 1 ? std::numeric_limits<float>::infinity() : 1.0f;
    scaler->scale(at::dot(w, at::full({2}, g))).backward();
    scaled.step();
    scaled.zero_grad();
    check(scaled.step_was_skipped() == (round == 0), "round " + std::to_string(round) + ": skipped on every rank iff a rank overflowed");
  }
  check(scaler->get_scale() == 4.0, "the scale backed off once, identically on every rank");
  check(w[0].item<float>() == -1.0f, "the finite round stepped with the unscaled gradient");
}

void train_until_killed() {
  Trainer acc{accel::Options{.comm = {.timeout = std::chrono::seconds(20), .rendezvous_timeout = std::chrono::seconds(20)}}};
  rank_ = acc.process_index();
  const int N = acc.num_processes();
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  at::manual_seed(1);
  auto [model, opt, loader] = acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1),
                                          accel::data::DataLoader(accel::data::TensorDataset(at::randn({400, 5}), at::randn({400, 2})),
                                                                  {.batch_size = 4, .shuffle = true}));
  int step = 0;
  for (const auto& b : loader) {
    if (++step == 5 && rank_ == N - 1) ::raise(SIGKILL);
    auto sync = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
  }
  check(false, "survived a dead peer");
}

void kill_mid_collective() {
  accel::ProcessState state(options(20000));
  rank_ = state.process_index();
  const int N = state.num_processes();
  for (int i = 0; i < 20; ++i) {
    if (i == 5 && rank_ == N - 1) ::raise(SIGKILL);
    auto t = F({1.0f});
    state.comm()->all_reduce(t);
  }
  check(false, "survived a dead peer");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    if (mode == "collectives") collectives(argc > 2 ? argv[2] : ".");
    else if (mode == "kill") kill_mid_collective();
    else if (mode == "golden" || mode == "golden-stream") {
      golden_workers_ = argc > 3 ? std::atoi(argv[3]) : 0;
      golden(argv[2], mode == "golden-stream");
    }
    else if (mode == "dispatch") dispatch_checks();
    else if (mode == "ddp") ddp_checks();
    else if (mode == "training") training_checks();
    else if (mode == "train-kill") train_until_killed();
    else if (mode == "rendezvous") {
      accel::ProcessState state(options(std::atoi(argc > 2 ? argv[2] : "5000")));
      rank_ = state.process_index();
      check(true, "rendezvous");
    } else {
      std::cerr << "unknown mode " << mode << "\n";
      return 2;
    }
  } catch (const accel::CommunicationError& e) {
    std::cerr << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 4;
  }
  std::cout << "rank " << rank_ << ": " << passed << " passed, " << failed << " failed" << std::endl;
  accel::ProcessState::reset();
  return failed == 0 ? 0 : 1;
}
