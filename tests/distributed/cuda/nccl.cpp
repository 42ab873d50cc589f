// The NCCL engine (cuda/nccl.hpp, dist::nccl) on 2 real processes, one GPU each: every collective of the communicator
// and of comm/collectives.hpp against values computed here, RNG synchronisation (the generators' state bytes against
// rank 0's), and a short DDP training run against one process on the concatenated batches. Without 2 visible GPUs
// (or in a build without CUDA) the mode prints "SKIPPED: needs 2 CUDA devices, found K" and exits 77 (ctest: skipped).
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/state/process_state.hpp>

#if ACCEL_WITH_CUDA
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <mutex>
#endif

#include <string>
#include <vector>

namespace mp {

#if ACCEL_WITH_CUDA
namespace {

// A generator's state bytes (a CPU byte tensor), read under its lock as the synchronisation reads them.
at::Tensor state_of(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

struct NcclTrainer : accel::Accelerator<accel::dist::nccl, accel::rng::sync<accel::rng::cuda, accel::rng::torch>> {};
// The same job fully sharded (shard::parameters): each unit gathered on the GPU by NCCL all-gathers, its gradients
// reduce-scattered.
struct NcclFsdpTrainer : accel::Accelerator<accel::dist::nccl, accel::rng::sync<accel::rng::cuda, accel::rng::torch>,
                                            accel::shard::parameters> {};

// The communicator's own operations, each on the GPU, against the values every rank can compute.
void communicator_ops(accel::comm::Communicator* c, int N, int r) {
  const auto dev = c->device();
  const auto f = at::TensorOptions().dtype(at::kFloat).device(dev),
             l = at::TensorOptions().dtype(at::kLong).device(dev);
  // all_reduce: sum, max, min, of floats and integers.
  auto s = at::full({1000}, float(r + 1), f);
  c->all_reduce(s);
  check(same(s.cpu(), at::full({1000}, float(N * (N + 1) / 2), at::kFloat)), "all_reduce(sum) of 1000 floats");
  auto mx = at::arange(4, l) + 10 * r;
  c->all_reduce(mx, accel::comm::ReduceOp::max);
  check(same(mx.cpu(), at::arange(4, at::kLong) + 10 * (N - 1)), "all_reduce(max) of longs");
  auto mn = at::arange(4, l) + 10 * r;
  c->all_reduce(mn, accel::comm::ReduceOp::min);
  check(same(mn.cpu(), at::arange(4, at::kLong)), "all_reduce(min) of longs");
  // broadcast from the last rank, in place.
  auto b = at::arange(6, l) + 100 * r;
  c->broadcast(b, N - 1);
  check(same(b.cpu(), at::arange(6, at::kLong) + 100 * (N - 1)), "broadcast from the last rank");
  // all_gather: rank q's part is q's values.
  auto parts = c->all_gather(at::full({3}, float(r), f));
  bool ok = int(parts.size()) == N;
  for (int q = 0; ok && q < N; ++q) ok = same(parts[std::size_t(q)].cpu(), at::full({3}, float(q), at::kFloat));
  check(ok, "all_gather in rank order");
  // scatter from rank 0: rank q receives chunk q (only the root's chunks are read).
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < N; ++q) chunks.push_back(at::full({5}, r == 0 ? float(7 * q) : -1.0f, f));
  auto got = at::zeros({5}, f);
  c->scatter(got, chunks, 0);
  check(same(got.cpu(), at::full({5}, float(7 * r), at::kFloat)), "scatter from rank 0");
  // reduce_scatter (sum): rank q gets the sum of every rank's part q.
  auto whole = at::arange(4 * N, f) * float(r + 1);
  auto part = at::zeros({4}, f);
  c->reduce_scatter(part, whole);
  check(same(part.cpu(), at::arange(4 * r, 4 * r + 4, at::kFloat) * float(N * (N + 1) / 2)), "reduce_scatter(sum)");
  // all_gather_into, in place (the part is the output's own slice).
  auto into = at::zeros({3 * N}, l);
  into.narrow(0, 3 * r, 3).fill_(r + 1);
  auto mine = into.narrow(0, 3 * r, 3);
  c->all_gather_into(into, mine);
  std::vector<int64_t> want;
  for (int q = 0; q < N; ++q) want.insert(want.end(), {q + 1, q + 1, q + 1});
  check(same(into.cpu(), T(want)), "all_gather_into in place");
  // all_gather_into_start (full sharding's prefetch): queued on accel's stream, finished later, equal to the above.
  auto later = at::zeros({3 * N}, l);
  auto gathering = c->all_gather_into_start(later, at::full({3}, int64_t(r + 1), l));
  c->finish(gathering);
  check(same(later.cpu(), T(want)), "all_gather_into_start / finish");
  // broadcast_coalesced: tensors of several dtypes packed into one NCCL broadcast, from rank 1.
  std::vector<at::Tensor> mixed{at::full({3}, float(r), f), at::full({2, 2}, int64_t(10 + r), l),
                                at::full({5}, double(r) / 4, at::TensorOptions().dtype(at::kDouble).device(dev))};
  c->broadcast_coalesced(mixed, 1);
  check(same(mixed[0].cpu(), at::full({3}, 1.0f, at::kFloat)) &&
            same(mixed[1].cpu(), at::full({2, 2}, int64_t(11), at::kLong)) &&
            same(mixed[2].cpu(), at::full({5}, 0.25, at::kDouble)),
        "broadcast_coalesced of float, long and double tensors from rank 1");
  // The gradient-bucket path: an all-reduce started asynchronously on accel's stream, finished later.
  auto bucket = at::arange(1 << 20, f) * float(r + 1);
  auto pending = c->all_reduce_start(bucket);
  c->finish(pending);
  check(same(bucket.cpu(), at::arange(1 << 20, at::kFloat) * float(N * (N + 1) / 2)),
        "all_reduce_start / finish of 4 MiB");
  // A CPU tensor is refused with the fix.
  std::string error;
  try {
    auto cpu = at::ones({2});
    c->all_reduce(cpu);
  } catch (const accel::Error& e) {
    error = e.what();
  }
  check(error.find("NCCL all_reduce needs CUDA tensors") != std::string::npos,
        "a CPU tensor is refused, naming the fix: " + error);
  c->barrier();
}

// comm/collectives.hpp through the NCCL communicator (with 2 processes none of them returns early).
void structured_collectives(accel::comm::Communicator* c, int N, int r) {
  const auto dev = c->device();
  auto g = accel::gather(c, at::full({2}, int64_t(r), at::TensorOptions().dtype(at::kLong).device(dev)));
  std::vector<int64_t> want;
  for (int q = 0; q < N; ++q) want.insert(want.end(), {q, q});
  check(g.is_cuda() && same(g.cpu(), T(want)), "gather in rank order, on the GPU");
  auto x = at::full({3}, float(r + 1), at::TensorOptions().dtype(at::kFloat).device(dev));
  check(same(accel::reduce(c, x, accel::Reduction::sum).cpu(), at::full({3}, float(N * (N + 1) / 2))), "reduce sum");
  check(same(accel::reduce(c, x, accel::Reduction::mean).cpu(), at::full({3}, float(N + 1) / 2)), "reduce mean");
  check(same(accel::reduce(c, x, accel::Reduction::max).cpu(), at::full({3}, float(N))), "reduce max");
  check(same(x.cpu(), at::full({3}, float(r + 1))), "reduce does not modify its input");
  auto bx = at::full({4}, float(r), at::TensorOptions().dtype(at::kFloat).device(dev));
  accel::broadcast(c, bx, N - 1);
  check(same(bx.cpu(), at::full({4}, float(N - 1))), "broadcast (collectives.hpp) from the last rank");
  auto mine = at::arange(r + 1, at::TensorOptions().dtype(at::kLong).device(dev));
  auto padded = accel::pad_across_processes(c, mine, 0, -1);
  std::vector<int64_t> pw;
  for (int i = 0; i < N; ++i) pw.push_back(i <= r ? i : -1);
  check(same(padded.cpu(), T(pw)), "pad_across_processes");
  check(accel::broadcast_object(c, "from rank " + std::to_string(r), N - 1) == "from rank " + std::to_string(N - 1),
        "broadcast_object");
  auto names = accel::gather_object(c, std::string(std::size_t(r + 1), char('a' + r)));
  bool ok = int(names.size()) == N;
  for (int q = 0; ok && q < N; ++q) ok = names[std::size_t(q)] == std::string(std::size_t(q + 1), char('a' + q));
  check(ok, "gather_object of strings of different lengths");
  // gather_for_metrics: every rank holds 4 rows, the last rank's last one is padding.
  accel::GatherLayout layout;
  for (int q = 0; q < N; ++q) {
    layout.size.push_back(4);
    layout.real.push_back(q == N - 1 ? 3 : 4);
  }
  auto rows = at::arange(4 * r, 4 * r + 4, at::TensorOptions().dtype(at::kLong).device(dev));
  check(same(accel::gather_for_metrics(c, rows, layout).cpu(), at::arange(4 * N - 1, at::kLong)),
        "gather_for_metrics drops the padding");
}

// synchronize_rng_states<sync<cuda, torch>> over NCCL: afterwards, this process's CPU generator and its GPU's
// generator hold rank 0's state bytes exactly.
void rng_sync(accel::comm::Communicator* c, const c10::Device& dev, int N, int r) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  at::Generator gpu = at::globalContext().defaultGenerator(dev);
  // Rank q's generators: seeded with 1000 + q, then q + 5 numbers drawn on the CPU and on this process's GPU.
  auto recipe = [&](int q) {
    at::manual_seed(1000 + std::uint64_t(q));  // the CPU and every GPU
    (void)at::rand({q + 5});
    (void)at::rand({q + 5}, at::TensorOptions().device(dev));
  };
  recipe(0);  // rank 0's states, computed on every rank
  const at::Tensor want_cpu = state_of(cpu), want_gpu = state_of(gpu);
  recipe(r);
  const at::Tensor before_cpu = state_of(cpu), before_gpu = state_of(gpu);
  check(r == 0 ? same(before_cpu, want_cpu) && same(before_gpu, want_gpu)
               : !same(before_cpu, want_cpu) && !same(before_gpu, want_gpu),
        "before the synchronisation, only rank 0 holds rank 0's states");
  accel::synchronize_rng_states<accel::rng::sync<accel::rng::cuda, accel::rng::torch>>(c);
  check(same(state_of(cpu), want_cpu), "the CPU generator's state bytes are rank 0's after synchronize_rng_states");
  check(c10::cuda::current_device() == dev.index(),
        "rng::cuda synchronises the current GPU's generator: the current GPU is this process's (cuda:" +
            std::to_string(dev.index()) + "), not cuda:" + std::to_string(c10::cuda::current_device()));
  check(same(state_of(gpu), want_gpu), "the generator of this process's GPU (cuda:" + std::to_string(dev.index()) +
                                           ") holds rank 0's state bytes after synchronize_rng_states");
  // The same numbers on every rank from now on, on the CPU and on the GPU.
  auto draws =
      accel::gather(c, at::cat({at::rand({4}).to(dev), at::rand({4}, at::TensorOptions().device(dev))}).unsqueeze(0));
  bool equal = draws.size(0) == N;
  for (int q = 1; equal && q < N; ++q) equal = same(draws[q].cpu(), draws[0].cpu());
  check(equal, "every rank draws the same numbers after the synchronisation");
}

// A short DDP run with the Accelerator on NCCL (and the same fully sharded): its parameters equal one process trained
// on the concatenated batches.
template <class Trainer>
void ddp_training(int N, int r) {
  constexpr bool full = Trainer::config::zero_stage == 3;
  const std::string mode = full ? "full sharding" : "DDP";
  Trainer acc{accel::Options{.bucket_bytes = 256, .sharding = {.units = {"0", "2"}}, .comm = options(60000).comm}};
  check(acc.num_processes() == N && acc.process_index() == r, "the Accelerator shares the NCCL job");
  const std::int64_t B = 3, steps = 4;
  auto make = [] { return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)); };
  at::manual_seed(7);
  const at::Tensor x = at::randn({steps * N * B, 5}), y = at::randn({steps * N * B, 2});
  at::manual_seed(100 + std::uint64_t(r));  // different initial weights on every rank: prepare broadcasts rank 0's
  auto net = make();
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.2));
  auto [model, opt, loader] =
      acc.prepare(net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = B}));
  check(net->parameters()[0].device() == acc.device() && acc.device().is_cuda(),
        "prepare put the model on this process's GPU");
  if constexpr (!full) check(model.distributed().buckets() > 1, "several gradient buckets");
  auto reference = make();  // one process on the CPU: the same start (rank 0's), one step on each N*B consecutive rows
  {
    const auto whole = acc.gather_parameters(model);  // full sharding: the whole model readable (nothing otherwise)
    torch::NoGradGuard no_grad;
    auto dst = reference->parameters();
    auto src = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i].cpu());
  }
  torch::optim::SGD ref_opt(reference->parameters(), 0.2);
  for (std::int64_t s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x.narrow(0, s * N * B, N * B)), y.narrow(0, s * N * B, N * B)).backward();
    ref_opt.step();
  }
  // Every rank's generators differ before the epoch; the epoch starts by synchronising them (rng::sync<cuda, torch>).
  at::manual_seed(500 + std::uint64_t(r));
  int batches = 0;
  bool on_gpu = true;
  for (const auto& b : loader) {
    on_gpu = on_gpu && b.data.device() == acc.device() && b.target.device() == acc.device();
    acc.backward(torch::mse_loss(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
    ++batches;
  }
  check(batches == steps, "every rank ran " + std::to_string(steps) + " steps (" + std::to_string(batches) + ")");
  check(on_gpu, "every batch arrived on this process's GPU");
  double worst = 0;
  {
    const auto whole = acc.gather_parameters(model);
    auto a = net->parameters(), ref = reference->parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, (a[i].cpu() - ref[i]).abs().max().template item<double>());
  }
  check(worst < 1e-5,
        mode + " over NCCL equals one process on the concatenated batches (max diff " + std::to_string(worst) + ")");
  auto states = accel::gather_object(acc.comm(), [] {
    auto s = state_of(at::detail::getDefaultCPUGenerator()).contiguous();
    return std::vector<std::uint8_t>(s.data_ptr<std::uint8_t>(), s.data_ptr<std::uint8_t>() + s.numel());
  }());
  bool equal = int(states.size()) == N;
  for (int q = 1; equal && q < N; ++q) equal = states[std::size_t(q)] == states[0];
  check(equal, "the epoch synchronised the CPU generators of every rank");
  acc.print("NCCL ", mode, " on ", N, " GPUs: max parameter difference to one process ", worst);
}

}  // namespace
#endif

void nccl(const Args&) {
#if ACCEL_WITH_CUDA
  const int gpus = accel::visible_gpus();
  if (gpus < 2) skip("needs 2 CUDA devices, found " + std::to_string(gpus));
  accel::ProcessState state(options(60000), accel::dist::nccl{});
  const int N = state.num_processes(), r = state.process_index();
  tally.rank = r;
  auto* c = state.comm();
  check(N >= 2 && c != nullptr, "several processes and a communicator");
  if (!c) return;
  check(state.distributed_type() == accel::DistributedType::multi_gpu, "dist::nccl: a multi-GPU job");
  check(state.device() == c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(state.local_process_index() % gpus)) &&
            c->device() == state.device(),
        "one GPU per process: cuda:" + std::to_string(state.local_process_index() % gpus));
  communicator_ops(c, N, r);
  structured_collectives(c, N, r);
  rng_sync(c, state.device(), N, r);
  ddp_training<NcclTrainer>(N, r);
  ddp_training<NcclFsdpTrainer>(N, r);
#else
  skip("needs 2 CUDA devices, found 0 (this build has no CUDA: ACCEL_WITH_CUDA=0)");
#endif
}

}  // namespace mp
