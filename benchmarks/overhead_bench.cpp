// Zero overhead, measured: accel's training loop against the same loop written by hand in LibTorch, 2 CPU processes
// on loopback (run under accel-launch; scripts/bench sets OMP_NUM_THREADS=1).
//  1. Training steps. accel: prepare + accumulate + backward (bucketed all-reduce started during backward) + the
//     wrapped step/zero_grad and scheduler. Hand: raw c10d (the same ProcessGroupGloo), its own sharded index loop
//     (a seeded randperm per epoch, Accelerate's round-robin batches), plain SGD and StepLR, and its own bucketed
//     gradient all-reduce after backward (25 MiB buckets in reverse registration order: flatten, all-reduce, divide,
//     copy back). The same model, data, initial weights and batch order on both sides; the small MLP (where
//     overhead shows) and the 14.7 M MLP, each with and without 2-step gradient accumulation; rounds alternate and
//     each side keeps its best.
//     The replica check (Options::check_replicas_every 100 and 1) against the same loop without it.
//  2. Per-call costs (ns) of what a loop calls every step, each beside the raw LibTorch call it wraps.
//  3. Rendezvous: 10 rounds of accel's (store, arrival check, heartbeat, Gloo mesh) against a bare TCPStore +
//     ProcessGroupGloo, each on fresh ports, both sides released together from a side store; order alternates.
//  4. Checkpoint archives: accel's zip and pickle checks beside LibTorch's own load_from of the same bytes.
// Rank 0 writes entries of build/bench/results.json to argv[1].
#include "mlp.hpp"

#include <accel/accel.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <thread>

namespace {
using namespace bench;
struct Acc : accel::Accelerator<accel::dist::gloo, accel::batches::per_process> {};
constexpr std::int64_t kBucketBytes = 25 * 1024 * 1024;

constexpr Size kSmall{"small", 32, 64, 128, 1, 40, 600}, kLarge{"large", 64, 1024, 2048, 4, 4, 16};

struct Data {
  at::Tensor x, y;
};
Data make_data(const Size& z, int processes, int accum) {
  at::manual_seed(1);
  const auto n = std::int64_t(z.warmup + z.steps * accum) * z.batch * processes;
  return {at::randn({n, z.inputs}), at::randint(0, kClasses, {n})};
}

// ---- 1. the training loop, through accel and by hand ---------------------------------------------------------

// Seconds per optimizer step through the Accelerator.
double accel_steps(const Size& z, int accum, const Data& d, accel::CommHook hook = accel::CommHook::none,
                   std::int64_t check_every = 0) {
  Acc acc{accel::Options{.seed = 3,
                         .gradient_accumulation_steps = accum,
                         .bucket_bytes = kBucketBytes,
                         .comm_hook = hook,
                         .check_replicas_every = check_every}};
  at::manual_seed(0);
  auto net = make_net(z);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1e-3));
  auto [model, opt, loader, sched] = acc.prepare(
      net, sgd, accel::data::DataLoader(accel::data::TensorDataset(d.x, d.y), {.batch_size = z.batch, .shuffle = true}),
      std::make_shared<torch::optim::StepLR>(*sgd, 100000));
  int i = 0;
  Clock::time_point t0;
  for (const auto& b : loader) {
    if (i++ == z.warmup) acc.wait_for_everyone(), t0 = Clock::now();
    auto step = acc.accumulate(model);
    acc.backward(torch::nn::functional::cross_entropy(model(b.data), b.target));
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  acc.wait_for_everyone();
  return seconds_since(t0) / z.steps;
}

// What a user writes without accel: the same job on raw c10d.
double hand_steps(c10d::Backend& pg, int rank, int N, const Size& z, int accum, const Data& d) {
  at::manual_seed(0);
  auto net = make_net(z);
  auto params = net->parameters();
  for (auto& p : params) {  // rank 0's initial weights everywhere
    std::vector<at::Tensor> v{p.data()};
    pg.broadcast(v)->wait();
  }
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-3));
  torch::optim::StepLR sched(sgd, 100000);
  // Buckets of at most 25 MiB, filled in reverse registration order (the order backward produces gradients).
  std::vector<std::vector<at::Tensor>> buckets(1);
  std::int64_t filled = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const auto bytes = it->numel() * std::int64_t(it->element_size());
    if (filled > 0 && filled + bytes > kBucketBytes) buckets.emplace_back(), filled = 0;
    buckets.back().push_back(*it);
    filled += bytes;
  }
  const auto sync_gradients = [&] {
    for (auto& bucket : buckets) {
      std::vector<at::Tensor> flat_parts;
      for (auto& p : bucket) flat_parts.push_back(p.grad().reshape({-1}));
      std::vector<at::Tensor> flat{at::cat(flat_parts)};
      pg.allreduce(flat)->wait();
      flat[0].div_(N);
      std::int64_t offset = 0;
      for (auto& p : bucket) {
        p.mutable_grad().copy_(flat[0].narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
    }
  };
  const std::int64_t samples = d.x.size(0), per_round = z.batch * N, rounds = samples / per_round;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto order = at::randperm(samples, gen);
  const auto* idx = order.data_ptr<std::int64_t>();
  Clock::time_point t0;
  for (std::int64_t j = 0; j < rounds; ++j) {
    if (j == z.warmup) {
      pg.barrier()->wait();
      t0 = Clock::now();
    }
    const auto mine = at::from_blob(const_cast<std::int64_t*>(idx + (j * N + rank) * z.batch), {z.batch}, at::kLong);
    const auto x = d.x.index_select(0, mine), y = d.y.index_select(0, mine);
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    if (accum > 1) loss = loss / accum;
    loss.backward();
    if ((j + 1) % accum == 0 || j + 1 == rounds) {
      sync_gradients();
      sgd.step();
      sched.step();
      sgd.zero_grad();
    }
  }
  pg.barrier()->wait();
  return seconds_since(t0) / z.steps;
}

// ---- 2. per-call costs ------------------------------------------------------------------------------------

// Nanoseconds per call of f, the median of `blocks` blocks of `iters` calls.
double ns_per_call(int iters, int blocks, const std::function<void()>& f) {
  for (int i = 0; i < iters / 10 + 1; ++i) f();
  std::vector<double> v;
  for (int k = 0; k < blocks; ++k) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    v.push_back(seconds_since(t0) * 1e9 / iters);
  }
  return median(v);
}

// ---- 3. rendezvous ------------------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::TCPStore> store_at(const accel::LaunchEnv& env, int port, bool wait_workers) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = env.rank == 0;
  o.numWorkers = env.world_size;
  o.waitWorkers = wait_workers;
  o.timeout = std::chrono::seconds(60);
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
}
// Releases every rank at once: each counts itself in, then waits until all have.
void release_together(c10d::Store& side, const std::string& key, int world) {
  side.add(key, 1);
  while (side.add(key, 0) < world) std::this_thread::sleep_for(std::chrono::microseconds(50));
}
}  // namespace

int main(int argc, char** argv) try {
  const std::string out_path = argc > 1 ? argv[1] : "overhead.json";
  // Sections to run (train, replicas, calls, hooks, buffers, rendezvous, checks): all by default.
  const std::vector<std::string> only(argv + std::min(argc, 2), argv + argc);
  const auto wanted = [&](const std::string& s) {
    return only.empty() || std::find(only.begin(), only.end(), s) != only.end();
  };
  Acc acc;
  const int N = acc.num_processes(), rank = acc.process_index();
  if (N < 2) throw accel::InvalidArgument("overhead_bench: run it under accel-launch --nproc-per-node 2");
  auto& pg = *dynamic_cast<accel::comm::GlooCommunicator&>(*acc.comm()).backend();  // raw calls, the same process group
  nlohmann::json entries = nlohmann::json::array();
  const auto add = [&](nlohmann::json e) {
    if (rank == 0)
      std::cout << e["name"].get<std::string>() << ": accel " << e["accel_seconds"].get<double>() << " s, "
                << e["baseline"].get<std::string>() << " " << e["baseline_seconds"].get<double>() << " s, ratio "
                << e["ratio"].get<double>() << std::endl;
    entries.push_back(std::move(e));
  };

  // 1. Training steps, accel against the hand-written loop.
  for (const auto& z : {kSmall, kLarge}) {
    if (!wanted("train")) break;
    for (int accum : {1, 2}) {
      const auto data = make_data(z, N, accum);
      double a = std::numeric_limits<double>::max(), h = a;
      for (int round = 0; round < 3; ++round) {  // alternate; each side keeps its best (the machine is shared)
        h = std::min(h, hand_steps(pg, rank, N, z, accum, data));
        a = std::min(a, accel_steps(z, accum, data));
      }
      add({{"name", std::string("train_step_") + z.name + (accum > 1 ? "_accumulate2" : "")},
           {"accel_seconds", a},
           {"baseline", "hand-written LibTorch + c10d loop"},
           {"baseline_seconds", h},
           {"ratio", a / h},
           {"goal", 1.02},
           {"processes", N},
           {"batch_per_process", z.batch},
           {"accumulation_steps", accum}});
    }
  }

  // 1b. The replica check (Options::check_replicas_every): the same accel loop with the check every 100 and every
  // step, against it without the check.
  if (wanted("replicas"))
    for (const std::int64_t every : {100, 1}) {
      const auto data = make_data(kSmall, N, 1);
      double with = std::numeric_limits<double>::max(), without = with;
      for (int round = 0; round < 5; ++round) {
        without = std::min(without, accel_steps(kSmall, 1, data));
        with = std::min(with, accel_steps(kSmall, 1, data, accel::CommHook::none, every));
      }
      add({{"name", "replica_check_every_" + std::to_string(every) + "_small"},
           {"accel_seconds", with},
           {"baseline", "the same accel loop without the check"},
           {"baseline_seconds", without},
           {"ratio", with / without},
           {"goal", every == 100 ? 1.01 : 1.5},
           {"processes", N},
           {"batch_per_process", kSmall.batch}});
    }

  // 2. Per-call costs on a tiny model: each accel call beside the raw call it wraps.
  if (wanted("calls")) {
    Acc calls{accel::Options{.gradient_accumulation_steps = 2}};
    torch::nn::Linear lin(4, 2);
    auto sgd = std::make_shared<torch::optim::SGD>(lin->parameters(), torch::optim::SGDOptions(0.0));
    auto [model, opt, sched] = calls.prepare(lin, sgd, std::make_shared<torch::optim::StepLR>(*sgd, 1000000000));
    torch::nn::Linear raw_lin(4, 2);
    torch::optim::SGD raw_sgd(raw_lin->parameters(), torch::optim::SGDOptions(0.0));
    torch::optim::StepLR raw_sched(raw_sgd, 1000000000);
    for (auto& p : lin->parameters()) p.mutable_grad() = at::zeros_like(p);
    for (auto& p : raw_lin->parameters()) p.mutable_grad() = at::zeros_like(p);
    const auto x = at::randn({8, 4});
    const auto per_call = [&](const std::string& name, const std::string& raw_name, int iters,
                              const std::function<void()>& ours, const std::function<void()>& raw) {
      acc.wait_for_everyone();
      const double o = ns_per_call(iters, 7, ours);
      acc.wait_for_everyone();
      const double r = raw ? ns_per_call(iters, 7, raw) : 0.0;
      nlohmann::json e{{"name", "per_call_" + name},
                       {"accel_seconds", o * 1e-9},
                       {"accel_ns", o},
                       {"baseline", raw_name},
                       {"baseline_seconds", r * 1e-9},
                       {"baseline_ns", r},
                       {"ratio", r > 0 ? o / r : 0.0},
                       {"processes", N}};
      add(e);
    };
    per_call("accumulate", "nothing (a hand loop counts steps in an int)", 100000,
             [&] { auto s = calls.accumulate(model); }, {});
    accel::GradientState::instance().set_sync_gradients(true);  // a step that synchronises: the wrapped step steps
    per_call(
        "optimizer_step", "torch::optim::SGD::step", 20000, [&] { opt.step(); }, [&] { raw_sgd.step(); });
    per_call(
        "zero_grad", "torch::optim::SGD::zero_grad", 20000, [&] { opt.zero_grad(); }, [&] { raw_sgd.zero_grad(); });
    per_call(
        "scheduler_step", "torch::optim::StepLR::step", 20000, [&] { sched.step(); }, [&] { raw_sched.step(); });
    // backward of a tiny loss on an unprepared model (no all-reduce): accel's scaling and bookkeeping only.
    // (accumulation 2: both sides divide the loss by 2, as a hand loop that accumulates does)
    per_call(
        "backward", "(loss / 2).backward()", 5000, [&] { calls.backward(raw_lin(x).sum()); },
        [&] { (raw_lin(x).sum() / 2.0).backward(); });
    const auto small = at::randn({4});
    per_call(
        "gather_for_metrics_4_floats", "c10d allgather + cat", 2000, [&] { (void)calls.gather_for_metrics(small); },
        [&] {
          std::vector<at::Tensor> in{small};
          std::vector<std::vector<at::Tensor>> out(1);
          for (int r = 0; r < N; ++r) out[0].push_back(at::empty_like(small));
          pg.allgather(out, in)->wait();
          (void)at::cat(out[0], 0);
        });
    // One step of a prepared loader (plan, fetch, transport, GradientState publication) against a hand index loop
    // over the same tensor dataset, batch 1 (the per-step cost, not the copy, dominates).
    const auto xs = at::randn({200000, 4});
    auto loader = calls.prepare(accel::data::DataLoader(accel::data::TensorDataset(xs, xs), {.batch_size = 1}));
    std::int64_t batches = 0;
    acc.wait_for_everyone();
    auto t0 = Clock::now();
    for (const auto& b : loader) batches += b.data.size(0);
    const double ours = seconds_since(t0) * 1e9 / double(loader.size());
    t0 = Clock::now();
    for (std::int64_t j = 0; j < xs.size(0) / N; ++j) {
      const auto i = at::scalar_tensor(j * N + rank, at::kLong).reshape({1});
      batches += xs.index_select(0, i).size(0) + xs.index_select(0, i).size(0);  // data and target, as TensorDataset
    }
    const double raw = seconds_since(t0) * 1e9 / double(xs.size(0) / N);
    add({{"name", "per_call_loader_step"},
         {"accel_seconds", ours * 1e-9},
         {"accel_ns", ours},
         {"baseline", "hand index_select loop"},
         {"baseline_seconds", raw * 1e-9},
         {"baseline_ns", raw},
         {"ratio", ours / raw},
         {"processes", N},
         {"batches", batches}});
  }

  // 3. Rendezvous, 10 rounds on fresh ports.
  // 2b. Gradient compression: the large MLP's training step with fp16 and bf16 buckets against uncompressed ones
  // (the bytes each backward sends, and the time per step; best of 3 alternating rounds).
  if (wanted("hooks")) {
    const auto data = make_data(kLarge, N, 1);
    double none = std::numeric_limits<double>::max(), fp16 = none, bf16 = none;
    for (int round = 0; round < 3; ++round) {
      none = std::min(none, accel_steps(kLarge, 1, data));
      fp16 = std::min(fp16, accel_steps(kLarge, 1, data, accel::CommHook::fp16));
      bf16 = std::min(bf16, accel_steps(kLarge, 1, data, accel::CommHook::bf16));
    }
    std::int64_t full = 0;
    for (const auto& p : make_net(kLarge)->parameters()) full += p.numel() * 4;
    for (const auto& [name, t] : {std::pair{"fp16", fp16}, std::pair{"bf16", bf16}})
      add({{"name", std::string("train_step_large_") + name + "_hook"},
           {"accel_seconds", t},
           {"baseline", "the same step, uncompressed"},
           {"baseline_seconds", none},
           {"ratio", t / none},
           {"processes", N},
           {"gradient_bytes", full / 2},
           {"baseline_gradient_bytes", full}});
  }

  // 3. DDP's buffer broadcast: the forward of a prepared BatchNorm MLP with broadcast_buffers on and off (both
  // with gradients, outside no_sync: the broadcast runs before every forward). Small: the digits example's width
  // (64-32-10) with a BatchNorm; large: 4 hidden layers of 1,920 with BatchNorm (14.8M parameters).
  if (wanted("buffers")) {
    struct BnSize {
      const char* name;
      std::int64_t inputs, hidden, layers, batch;
      int iters;
    };
    for (const BnSize z : {BnSize{"small", 64, 32, 1, 32, 2000}, BnSize{"large", 1920, 1920, 4, 64, 40}}) {
      auto make = [&] {
        torch::nn::Sequential net;
        std::int64_t in = z.inputs;
        for (std::int64_t l = 0; l < z.layers; ++l)
          net->push_back(torch::nn::Linear(in, z.hidden)), net->push_back(torch::nn::BatchNorm1d(z.hidden)),
              net->push_back(torch::nn::ReLU()), in = z.hidden;
        net->push_back(torch::nn::Linear(in, bench::kClasses));
        return net;
      };
      Acc on{accel::Options{.broadcast_buffers = true}}, off{accel::Options{.broadcast_buffers = false}};
      auto with = on.prepare(make());
      auto without = off.prepare(make());
      std::int64_t params = 0;
      for (const auto& p : with->parameters()) params += p.numel();
      const auto x = at::randn({z.batch, z.inputs});
      acc.wait_for_everyone();
      const double o = ns_per_call(z.iters, 7, [&] { (void)with(x); });
      acc.wait_for_everyone();
      const double r = ns_per_call(z.iters, 7, [&] { (void)without(x); });
      add({{"name", std::string("per_forward_buffers_") + z.name},
           {"accel_seconds", o * 1e-9},
           {"accel_ns", o},
           {"baseline", "the same forward with broadcast_buffers = false"},
           {"baseline_seconds", r * 1e-9},
           {"baseline_ns", r},
           {"ratio", o / r},
           {"processes", N},
           {"parameters", params},
           {"batch_per_process", z.batch}});
    }
  }

  if (wanted("rendezvous")) {
    const auto env = accel::detect_launch_env();
    auto side = store_at(env, env.master_port + 1, true);
    std::vector<double> ours, raw, sealed;
    for (int round = 0; round < 10; ++round) {
      const int port = env.master_port + 10 + 3 * round;
      const auto run_raw = [&] {
        release_together(*side, "raw" + std::to_string(round), N);
        const auto t0 = Clock::now();
        auto store = store_at(env, port, false);
        auto o = c10d::ProcessGroupGloo::Options::create();
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, o);
        raw.push_back(seconds_since(t0));
        group->barrier()->wait();
      };
      const auto run_ours = [&] {
        release_together(*side, "accel" + std::to_string(round), N);
        const auto t0 = Clock::now();
        auto comm = accel::comm::make_gloo_communicator(
            {.addr = env.master_addr, .port = port + 1, .rank = env.rank, .size = env.world_size},
            accel::comm::CommOptions{});
        ours.push_back(seconds_since(t0));
        comm->barrier();
      };
      // The same with a job secret: every store value sealed and checked (state/rendezvous/store.hpp).
      const auto run_sealed = [&] {
        release_together(*side, "sealed" + std::to_string(round), N);
        const auto t0 = Clock::now();
        auto comm =
            accel::comm::make_gloo_communicator({.addr = env.master_addr,
                                                 .port = port + 2,
                                                 .rank = env.rank,
                                                 .size = env.world_size,
                                                 .job = {.id = "bench", .secret = "0123456789abcdef0123456789abcdef"}},
                                                accel::comm::CommOptions{});
        sealed.push_back(seconds_since(t0));
        comm->barrier();
      };
      if (round % 2 == 0)
        run_raw(), run_ours(), run_sealed();
      else
        run_sealed(), run_ours(), run_raw();
    }
    std::sort(sealed.begin(), sealed.end());
    // What a heartbeat adds with a secret: one seal of its value, and (while watching) one check per peer.
    const accel::rendezvous::Seal seal("0123456789abcdef0123456789abcdef");
    const std::string beat_key = "accel/0123456789abcdef0123456789abcdef/0/beat/1";
    const std::vector<std::uint8_t> beat_value(200, 'x');  // a count, a flag and 8 published collectives
    const int reps = 20000;
    auto t_seal = Clock::now();
    std::size_t sink = 0;
    for (int i = 0; i < reps; ++i) sink += seal.seal(beat_key, beat_value).size();
    const double seal_s = seconds_since(t_seal) / reps;
    const auto one = seal.seal(beat_key, beat_value);
    t_seal = Clock::now();
    for (int i = 0; i < reps; ++i) sink += seal.open(beat_key, one)->size();
    const double open_s = seconds_since(t_seal) / reps;
    add({{"name", "rendezvous_authenticated"},
         {"accel_seconds", sealed[sealed.size() / 2]},
         {"baseline", "accel's rendezvous without a secret"},
         {"baseline_seconds", median(ours)},
         {"ratio", sealed[sealed.size() / 2] / median(ours)},
         {"processes", N},
         {"seal_seconds_per_beat_value", seal_s},
         {"open_seconds_per_beat_value", open_s},
         {"sink", double(sink % 7)}});
    const auto ours_rounds = ours, raw_rounds = raw;
    std::sort(ours.begin(), ours.end());
    std::sort(raw.begin(), raw.end());
    add({{"name", "rendezvous"},
         {"accel_seconds", median(ours)},
         {"baseline", "raw c10d (TCPStore + ProcessGroupGloo)"},
         {"baseline_seconds", median(raw)},
         {"ratio", median(ours) / median(raw)},
         {"goal", 2.0},
         {"processes", N},
         {"accel_min_max_seconds", {ours.front(), ours.back()}},
         {"baseline_min_max_seconds", {raw.front(), raw.back()}},
         {"worst_ratio", ours.back() / raw.back()},
         {"rounds", ours.size()},
         {"accel_rounds_seconds", ours_rounds},
         {"baseline_rounds_seconds", raw_rounds}});
  }
  // 4. The checks of a checkpoint archive before LibTorch reads it (checkpoint/archive.hpp, checkpoint/pickle.hpp:
  // the zip structure, every pickle run as LibTorch's unpickler would), against LibTorch's own load_from of the
  // same bytes, which every load pays anyway. Two archives: 10 tensors of 1 MiB, 1000 tensors of 64 KiB.
  if (wanted("checks") && rank == 0)
    for (const int tensors : {10, 1000}) {
      torch::serialize::OutputArchive out;
      for (int k = 0; k < tensors; ++k) out.write("t" + std::to_string(k), at::randn({tensors == 10 ? 1024 : 64, 256}));
      std::ostringstream saved;
      out.save_to(saved);
      const std::string b = saved.str();
      const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
      double check = std::numeric_limits<double>::max(), load = check;
      for (int round = 0; round < 20; ++round) {  // alternate; each side keeps its best
        auto t0 = std::chrono::steady_clock::now();
        accel::checkpoint::check_zip(bytes, "bench.pt");
        check = std::min(check, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        t0 = std::chrono::steady_clock::now();
        torch::serialize::InputArchive in;
        in.load_from(b.data(), b.size());
        load = std::min(load, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      add({{"name", "archive_checks_" + std::to_string(tensors) + "_tensors"},
           {"accel_seconds", check},
           {"baseline", "LibTorch's InputArchive::load_from of the same bytes"},
           {"baseline_seconds", load},
           {"ratio", check / load},
           {"goal", 0.1},
           {"archive_bytes", b.size()},
           {"tensors", tensors}});
    }
  if (rank == 0) std::ofstream(out_path) << entries.dump(2) << "\n";
  acc.wait_for_everyone();
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
