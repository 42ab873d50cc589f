// GPU tests of the CUDA specialisations. Without a visible GPU they exit 77, which CTest reports as
// "Skipped" (the code was compiled and linked, which every build checks). With a GPU: a 1-process NCCL
// communicator runs every collective and every value is compared with its expectation. With one process the
// functions of comm/collectives.hpp and synchronize_rng_states return before NCCL, so the communicator's own
// operations (which reach NCCL whatever the size) are checked too; 2 processes: mp.nccl.2proc.
#include <accel/accel.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace {
int passed = 0, failed = 0;
void check(bool ok, const char* what) {
  ok ? ++passed : ++failed;
  if (!ok) std::cerr << "FAILED: " << what << std::endl;
}
// Same shape, dtype and values (at::equal alone ignores the dtype).
bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
}
// A generator's state bytes (a CPU byte tensor), read under its lock.
at::Tensor state_of(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
}  // namespace

int main() {
  if (c10::cuda::device_count() == 0) {
    std::cout << "SKIPPED: no CUDA device visible; the NCCL communicator and the CUDA RNG path were compiled and "
                 "linked, not run"
              << std::endl;
    return 77;
  }
  accel::rendezvous::RendezvousSpec spec;
  spec.port = 29761;  // not a port of the multi-process tests (tests/CMakeLists.txt), which may run alongside
  accel::comm::CommOptions opt;
  opt.timeout = std::chrono::seconds(30);
  auto comm = accel::cuda::make_nccl_communicator(spec, opt, 0);
  auto* c = comm.get();
  const auto dev = c->device();
  check(dev.is_cuda(), "the NCCL communicator works on the GPU");
  auto on = [&](at::Tensor t) { return t.to(dev); };
  auto x = on(at::arange(8, at::kFloat));
  check(at::equal(accel::gather(c, x).cpu(), at::arange(8, at::kFloat)), "gather");
  check(at::equal(accel::reduce(c, x, accel::Reduction::mean).cpu(), at::arange(8, at::kFloat)), "reduce mean");
  check(at::equal(accel::reduce(c, x, accel::Reduction::max).cpu(), at::arange(8, at::kFloat)), "reduce max");
  auto b = on(at::full({3}, 5, at::kLong));
  accel::broadcast(c, b, 0);
  check(at::equal(b.cpu(), at::full({3}, 5, at::kLong)), "broadcast");
  check(same(accel::pad_across_processes(c, x, 0, -1).cpu(), at::arange(8, at::kFloat)), "pad_across_processes");
  check(accel::broadcast_object(c, std::string("nccl")) == "nccl", "broadcast_object");
  check(accel::gather_object(c, 3) == std::vector<int>{3}, "gather_object");
  auto g = accel::gather_for_metrics(c, x, {.size = {8}, .real = {6}});
  check(at::equal(g.cpu(), at::arange(6, at::kFloat)), "gather_for_metrics");
  // The gradient-bucket path of DistributedModule: an all-reduce started asynchronously, finished later.
  {
    auto t = on(at::arange(1024, at::kFloat));
    auto pending = c->all_reduce_start(t);
    c->finish(pending);
    check(at::equal(t.cpu(), at::arange(1024, at::kFloat)), "all_reduce_start / finish on the NCCL stream");
  }
  // The communicator's own operations reach NCCL with one rank too: each result against its expectation.
  {
    auto s = on(at::full({1000}, 3.5f));
    c->all_reduce(s);
    check(same(s.cpu(), at::full({1000}, 3.5f)), "all_reduce(sum) over NCCL");
    auto m = on(at::arange(5, at::kLong));
    c->all_reduce(m, accel::comm::ReduceOp::max);
    check(same(m.cpu(), at::arange(5, at::kLong)), "all_reduce(max) of longs over NCCL");
    auto bc = on(at::arange(6, at::kLong) + 100);
    c->broadcast(bc, 0);
    check(same(bc.cpu(), at::arange(6, at::kLong) + 100), "broadcast over NCCL");
    auto parts = c->all_gather(on(at::full({3}, 2.0f)));
    check(parts.size() == 1 && same(parts[0].cpu(), at::full({3}, 2.0f)), "all_gather over NCCL");
    auto got = on(at::zeros({4}));
    c->scatter(got, {on(at::full({4}, 9.0f))}, 0);
    check(same(got.cpu(), at::full({4}, 9.0f)), "scatter over NCCL (send and receive in one group)");
    auto part = on(at::zeros({4}));
    c->reduce_scatter(part, on(at::arange(4, at::kFloat)));
    check(same(part.cpu(), at::arange(4, at::kFloat)), "reduce_scatter over NCCL");
    auto whole = on(at::zeros({4}));
    c->all_gather_into(whole, on(at::arange(4, at::kFloat) + 1));
    check(same(whole.cpu(), at::arange(4, at::kFloat) + 1), "all_gather_into over NCCL");
    std::vector<at::Tensor> mixed{on(at::full({3}, 1.5f)), on(at::full({2}, int64_t(7), at::kLong))};
    c->broadcast_coalesced(mixed, 0);
    check(same(mixed[0].cpu(), at::full({3}, 1.5f)) && same(mixed[1].cpu(), at::full({2}, int64_t(7), at::kLong)),
          "broadcast_coalesced over NCCL");
  }
  c->barrier();
  // RNG: synchronize_rng_states returns before NCCL with one process, so the broadcast it runs per generator
  // (detail::broadcast_generator_state) is driven directly: the state bytes come back unchanged (the source rank's
  // own), and the generators draw what a generator seeded alike draws.
  {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    at::Generator gpu = at::globalContext().defaultGenerator(dev);
    at::manual_seed(1234);
    (void)at::rand({3});
    (void)at::rand({3}, at::TensorOptions().device(dev));
    const at::Tensor cpu_state = state_of(cpu), gpu_state = state_of(gpu);
    accel::synchronize_rng_states<accel::rng::sync<accel::rng::cuda, accel::rng::torch>>(c);
    check(same(state_of(cpu), cpu_state) && same(state_of(gpu), gpu_state),
          "synchronize_rng_states (cuda, torch) with one process leaves both states as they were");
    accel::detail::broadcast_generator_state(*c, cpu);
    check(same(state_of(cpu), cpu_state),
          "the CPU generator's state bytes, broadcast over NCCL, are the source rank's");
    accel::detail::broadcast_generator_state(*c, gpu);
    check(same(state_of(gpu), gpu_state),
          "the GPU generator's state bytes, broadcast over NCCL, are the source rank's");
    const at::Tensor drawn = at::rand({4}, at::TensorOptions().device(dev)).cpu(), drawn_cpu = at::rand({4});
    at::manual_seed(1234);
    (void)at::rand({3});
    (void)at::rand({3}, at::TensorOptions().device(dev));
    check(same(drawn, at::rand({4}, at::TensorOptions().device(dev)).cpu()) && same(drawn_cpu, at::rand({4})),
          "after the broadcast both generators draw what the same seed draws");
  }
  // place::async: batches staged in pinned memory and copied on a side stream by the loader's workers.
  {
    struct Async : accel::Accelerator<accel::dist::nccl, accel::place::async> {};
    accel::data::DataLoader dl(
        accel::data::TensorDataset(at::arange(4096, at::kFloat).reshape({1024, 4}), at::arange(1024)),
        {.batch_size = 64, .workers = 2, .prefetch = 2});
    auto loader = accel::data::prepare_data_loader<Async::config>(dl, accel::data::PrepareContext{1, 0, nullptr, dev});
    std::int64_t next = 0;
    bool ok = true;
    for (const auto& b : loader) {
      ok &= b.data.is_cuda() && b.target.is_cuda() && b.target[0].item<std::int64_t>() == next;
      next += 64;
    }
    check(ok && next == 1024, "place::async delivers every batch on the GPU, in order");
    // Throughput: async staging versus a plain synchronous copy of the same batches.
    auto big = accel::data::TensorDataset(at::rand({1 << 16, 1024}), at::arange(1 << 16));
    auto time_epoch = [&](auto config_tag) {
      using C = typename decltype(config_tag)::type;
      accel::data::DataLoader d(big, {.batch_size = 1024, .workers = 2, .prefetch = 2});
      auto l = accel::data::prepare_data_loader<C>(d, accel::data::PrepareContext{1, 0, nullptr, dev});
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& b : l) (void)b.data.sum().template item<float>();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    struct Sync : accel::Accelerator<accel::dist::nccl, accel::place::device> {};
    const double sync_s = time_epoch(std::type_identity<Sync::config>{});
    const double async_s = time_epoch(std::type_identity<Async::config>{});
    std::cout << "256 MiB epoch to the GPU: place::device " << sync_s << " s, place::async " << async_s << " s, ratio "
              << async_s / sync_s << std::endl;
  }
  // Throughput of a 64 MiB all_reduce on this GPU (a figure for the notes).
  auto big = on(at::rand({16 * 1024 * 1024}));
  c->all_reduce(big);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) c->all_reduce(big);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20;
  std::cout << "64 MiB all_reduce on 1 GPU: " << s * 1e3 << " ms" << std::endl;
  std::cout << passed << " passed, " << failed << " failed" << std::endl;
  return failed == 0 ? 0 : 1;
}
