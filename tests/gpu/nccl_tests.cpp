// GPU tests of the CUDA specialisations. Without a visible GPU they exit 77, which CTest reports as
// "Skipped" (the code was compiled and linked, which every build checks). With a GPU: a 1-process NCCL
// communicator runs every collective and every tensor is checked.
#include <accel/accel.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <iostream>

namespace {
int passed = 0, failed = 0;
void check(bool ok, const char* what) {
  ok ? ++passed : ++failed;
  if (!ok) std::cerr << "FAILED: " << what << std::endl;
}
}  // namespace

int main() {
  if (c10::cuda::device_count() == 0) {
    std::cout << "SKIPPED: no CUDA device visible; the NCCL communicator and the CUDA RNG path were compiled and "
                 "linked, not run" << std::endl;
    return 77;
  }
  accel::rendezvous::RendezvousSpec spec;
  spec.port = 29741;
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
  check(accel::pad_across_processes(c, x).size(0) == 8, "pad_across_processes");
  check(accel::broadcast_object(c, std::string("nccl")) == "nccl", "broadcast_object");
  check(accel::gather_object(c, 3).size() == 1, "gather_object");
  auto g = accel::gather_for_metrics(c, x, {.size = {8}, .real = {6}});
  check(at::equal(g.cpu(), at::arange(6, at::kFloat)), "gather_for_metrics");
  // The gradient-bucket path of DistributedModule: an all-reduce started asynchronously, finished later.
  {
    auto t = on(at::arange(1024, at::kFloat));
    auto pending = c->all_reduce_start(t);
    c->finish(pending);
    check(at::equal(t.cpu(), at::arange(1024, at::kFloat)), "all_reduce_start / finish on the NCCL stream");
  }
  c->barrier();
  accel::synchronize_rng_states<accel::rng::sync<accel::rng::cuda, accel::rng::torch>>(c);
  check(true, "rng sync (cuda, torch)");
  // place::async: batches staged in pinned memory and copied on a side stream by the loader's workers.
  {
    struct Async : accel::Accelerator<accel::dist::nccl, accel::place::async> {};
    accel::data::DataLoader dl(accel::data::TensorDataset(at::arange(4096, at::kFloat).reshape({1024, 4}), at::arange(1024)),
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
