// Collectives (comm/collectives.hpp, comm/rng.hpp, state/process_state.hpp) on N real processes: gather (rank order,
// 0-dim, nested and described structs), broadcast, reduce, pad_across_processes, typed object collectives,
// split_between_processes, main_process_first, RNG synchronisation. gather_for_metrics has its own file.
#include "../harness.hpp"

#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/scalar_tensor.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace mp {

namespace {
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
}  // namespace

// Everything in ProcessState and comm/ on every rank, value by value. args: [SCRATCH] (a directory for a file).
void collectives(const Args& args) {
  const std::string scratch = arg(args, 0, ".");
  accel::ProcessState state(options(30000));
  const int N = state.num_processes(), r = state.process_index();
  tally.rank = r;
  auto* comm = state.comm();
  check(N >= 2 && comm != nullptr, "several processes and a communicator");
  check(state.distributed_type() == accel::DistributedType::multi_cpu, "no GPU: the CPU engine without a flag");
  check(state.is_main_process() == (r == 0) && state.is_last_process() == (r == N - 1), "main/last predicates");
  check(state.device().is_cpu(), "device cpu");
  accel::ProcessState again;  // the first construction wins
  check(again.comm() == comm, "ProcessState is shared");

  // gather: rank order, 0-dim becomes 1-dim, nested structures, described structs.
  check(same(accel::gather(comm, T({r, r})),
             [&] {
               std::vector<int64_t> v;
               for (int i = 0; i < N; ++i) v.insert(v.end(), {i, i});
               return T(v);
             }()),
        "gather 1-d");
  check(same(accel::gather(comm, at::scalar_tensor(r, at::kLong)), at::arange(N, at::kLong)),
        "gather of 0-dim tensors");
  auto two_d = accel::gather(comm, at::full({1, 2}, r, at::kFloat));
  check(two_d.sizes() == at::IntArrayRef({N, 2}) && two_d[N - 1][1].item<float>() == float(N - 1), "gather 2-d");
  Batch b{T({r}), F({float(r) / 2})};
  auto gb = accel::gather(comm, b);
  check(same(gb.data, at::arange(N, at::kLong)) && gb.target[N - 1].item<float>() == float(N - 1) / 2,
        "gather of a described struct");
  check(b.data.item<int64_t>() == r, "gather does not modify its input");
  std::map<std::string, std::tuple<at::Tensor, std::vector<at::Tensor>>> nested{
      {"x", {T({r}), {T({10 * r}), T({-r})}}}};
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
  check(accel::pad_across_processes(comm, mat, -1).sizes() == at::IntArrayRef({2, N}),
        "pad_across_processes negative dim");

  // Objects: typed serialisation.
  Metrics m{"rank" + std::to_string(r), {1.5 * r, 2.0}, {{"a", r}, {"b", 7}}};
  auto mb = accel::broadcast_object(comm, m, 1);
  check(mb.name == "rank1" && mb.values == std::vector<double>{1.5, 2.0} && mb.counts.at("a") == 1,
        "broadcast_object of a struct");
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
  check(int(pshare.size()) == (7 + N - 1) / N && (pshare.size() == expect.size() || pshare.back() == 6),
        "split with padding");
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

}  // namespace mp
