// Two processes (or more) shard shuffled epochs exactly as Accelerate does, and prove that nothing is lost or
// duplicated. Run it under the launcher:   build/tools/accel-launch --nproc-per-node 2 build/examples/shard_epoch
//
// Each process is seeded differently on purpose; rng::generator synchronisation (rank 0's sampler generator
// broadcast over Gloo at every epoch) still puts every rank on the same permutation. Each rank takes its
// batches from the plan; gather_for_metrics collects every rank's samples and drops exactly the padding.
#include <accel/accel.hpp>

#include <ATen/ops/tensor.h>

#include <iostream>
#include <numeric>
#include <vector>

struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::even> {};

int main() {
  accel::ProcessState state;
  auto* comm = state.comm();
  const int N = state.num_processes(), r = state.process_index();
  const std::int64_t n = 1000, batch = 32;

  accel::set_seed(1234, r, /*device_specific=*/true);  // deliberately different on every rank
  std::optional<at::Generator> generator = accel::data::synchronized_generator();
  accel::data::RandomSampler sampler(n, *generator);

  for (int epoch = 0; epoch < 3; ++epoch) {
    accel::synchronize_rng_states<Acc::config::rng>(comm, generator);  // rank 0's generator everywhere
    const auto order = sampler.next_epoch();
    std::vector<accel::plan::BatchPlan> plans;  // every rank's plan: pure math, no messages
    for (int q = 0; q < N; ++q)
      plans.push_back(accel::plan::loader_plan({.batch_size = batch,
                                                .num_processes = N,
                                                .process_index = q,
                                                .split_batches = Acc::config::split_batches,
                                                .even_batches = Acc::config::even_batches},
                                               n, accel::plan::Loading::sharded));
    std::vector<std::int64_t> seen;
    std::int64_t padding = 0;
    for (const auto& b : accel::data::planned_batches(plans[std::size_t(r)], order)) {
      std::vector<std::int64_t> idx;
      b.indices_into(idx);
      padding += b.padding();
      accel::GatherLayout layout;
      for (const auto& p : plans)
        layout.size.push_back(p.span(b.number()).size()), layout.real.push_back(p.real(b.number()));
      const auto all = accel::gather_for_metrics(comm, at::tensor(idx, at::kLong), layout);
      seen.insert(seen.end(), all.data_ptr<std::int64_t>(), all.data_ptr<std::int64_t>() + all.numel());
    }
    std::vector<int> count(std::size_t(n), 0);
    for (auto i : seen) ++count[std::size_t(i)];
    const bool exact = std::all_of(count.begin(), count.end(), [](int c) { return c == 1; });
    state.print("epoch ", epoch, ": ", N, " processes x ", plans[0].size(), " batches of ", batch, "; first indices ",
                order[0], " ", order[1], " ", order[2], "; gathered ", seen.size(), " samples for a dataset of ", n,
                exact ? ", each exactly once" : ", NOT each exactly once");
    const auto totals = accel::gather_object(comm, padding);
    state.print("         padding duplicates per rank (dropped by gather_for_metrics): ",
                std::accumulate(totals.begin(), totals.end(), std::string(), [](std::string s, std::int64_t p) {
                  return s + (s.empty() ? "" : ", ") + std::to_string(p);
                }));
    if (!exact) return 1;
  }
  state.wait_for_everyone();
  return 0;
}
