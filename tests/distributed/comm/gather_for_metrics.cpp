// gather_for_metrics (comm/collectives.hpp) on N real processes: every sample exactly once with the padding the
// plan marks dropped, no duplicate with an uneven tail, different row counts per rank (tensors and objects).
#include "../harness.hpp"

#include <accel/comm/collectives.hpp>
#include <accel/plan/plan.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/ops/full.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace mp {

// gather_for_metrics with the plan's layout on every rank: n=10 samples, batch 3, an even tail (padding on the last
// batch) then an uneven tail (different batch sizes per rank); then ranks holding different numbers of rows.
void gather_for_metrics(const Args&) {
  accel::ProcessState state(options(30000));
  const int N = state.num_processes(), r = state.process_index();
  tally.rank = r;
  auto* comm = state.comm();
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
    for (int q = 1; q < N; ++q)
      for (int i = 0; i < q; ++i) w.push_back(q);
    check(same(g, T(w)), "gather_for_metrics with different sizes per rank");
    // The same batch as objects: the elements the tensor form keeps, in its order.
    std::vector<std::string> mine(std::size_t(r + 1), std::string(std::size_t(r + 1), char('a' + r)));
    std::vector<std::string> want;
    for (const auto q : w) want.push_back(std::string(std::size_t(q + 1), char('a' + q)));
    check(accel::gather_for_metrics(comm, mine, layout) == want,
          "gather_for_metrics of objects with different sizes per rank");
  }

  state.print("gather_for_metrics on ", N, " processes: checked");
}

}  // namespace mp
