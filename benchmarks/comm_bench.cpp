// Collectives side by side: accel's API versus the raw c10d calls on the same Gloo process group, for a 4 B
// and a 64 MiB float tensor (and full sharding's all-gather and reduce-scatter at one unit's size), in 2 processes on
// loopback (run it under accel-launch). Blocks of raw and accel iterations alternate; the median per-iteration time of
// each side is reported. Also the rendezvous time: accel's ProcessState (rendezvous, heartbeat, Gloo mesh) versus a
// bare TCPStore + ProcessGroupGloo. Rank 0 writes the entries of build/bench/results.json to argv[1].
#include <accel/comm/collectives.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Alternates blocks of `iters` calls of each side; returns (accel, raw) median seconds per call.
std::pair<double, double> compare(accel::comm::Communicator& comm, int iters, int blocks,
                                  const std::function<void()>& ours, const std::function<void()>& raw) {
  std::vector<double> a, b;
  for (int i = 0; i < iters; ++i) ours(), raw();  // warm-up
  for (int k = 0; k < blocks; ++k) {
    for (auto [f, out] : {std::pair{&raw, &b}, std::pair{&ours, &a}}) {
      comm.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) (*f)();
      out->push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
    }
  }
  return {median(a), median(b)};
}
}  // namespace

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "comm.json";
  auto env = accel::detect_launch_env();

  // Rendezvous: first a store-only meeting (so that neither side pays for the processes' start skew), then
  // bare c10d (on the next port), then accel's.
  c10d::TCPStoreOptions sync;
  sync.port = static_cast<std::uint16_t>(env.master_port + 2);
  sync.isServer = env.rank == 0;
  sync.numWorkers = env.world_size;
  sync.waitWorkers = true;
  auto meeting = c10::make_intrusive<c10d::TCPStore>(env.master_addr, sync);
  meeting->add("ready", 1);
  meeting->wait({"ready"});
  while (meeting->add("ready", 0) < env.world_size) std::this_thread::sleep_for(std::chrono::microseconds(100));
  const auto r0 = Clock::now();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port + 1);
  so.isServer = env.rank == 0;
  so.numWorkers = env.world_size;
  so.waitWorkers = true;
  auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  auto go = c10d::ProcessGroupGloo::Options::create();
  go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto raw_pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, go);
  const double raw_rdzv = std::chrono::duration<double>(Clock::now() - r0).count();
  const auto r1 = Clock::now();
  accel::ProcessState state;
  const double accel_rdzv = std::chrono::duration<double>(Clock::now() - r1).count();
  auto& comm = *state.comm();
  auto& pg =
      *dynamic_cast<accel::comm::GlooCommunicator&>(comm).backend();  // raw calls on the same process group as accel's

  nlohmann::json entries = nlohmann::json::array();
  auto add = [&](const std::string& name, std::pair<double, double> t, const nlohmann::json& extra = {}) {
    nlohmann::json e{{"name", name},
                     {"accel_seconds", t.first},
                     {"baseline", "raw c10d"},
                     {"baseline_seconds", t.second},
                     {"ratio", t.first / t.second},
                     {"processes", env.world_size}};
    for (auto& [k, v] : extra.items()) e[k] = v;
    entries.push_back(e);
    if (env.rank == 0)
      std::cout << name << ": accel " << t.first * 1e6 << " us, raw " << t.second * 1e6 << " us, ratio "
                << t.first / t.second << std::endl;
  };

  // 4 B and 8 B travel unchecked (Gloo's fast path, checked by the next collective); 16 B and 4 KiB carry the
  // 64-slot collective check in the same message; 64 MiB is preceded by a check collective of its own.
  for (const auto& [label, numel, iters, blocks] :
       {std::tuple{"4B", int64_t(1), 400, 9}, std::tuple{"16B", int64_t(4), 200, 9},
        std::tuple{"4KiB", int64_t(1024), 200, 9}, std::tuple{"64MiB", int64_t(16) << 20, 3, 5}}) {
    at::Tensor x = at::ones({numel});
    add(std::string("all_reduce_") + label, compare(
                                                comm, iters, blocks, [&] { comm.all_reduce(x); },
                                                [&] {
                                                  std::vector<at::Tensor> v{x};
                                                  pg.allreduce(v)->wait();
                                                }));
    add(std::string("gather_") + label, compare(
                                            comm, iters, blocks, [&] { (void)accel::gather(&comm, x); },
                                            [&] {
                                              std::vector<at::Tensor> in{x};
                                              std::vector<std::vector<at::Tensor>> out(1);
                                              for (int r = 0; r < env.world_size; ++r)
                                                out[0].push_back(at::empty_like(x));
                                              pg.allgather(out, in)->wait();
                                              (void)at::cat(out[0], 0);
                                            }));
    add(std::string("broadcast_") + label, compare(
                                               comm, iters, blocks, [&] { accel::broadcast(&comm, x); },
                                               [&] {
                                                 std::vector<at::Tensor> v{x};
                                                 pg.broadcast(v)->wait();
                                               }));
  }
  // Full sharding's collectives at the size of one unit of the linear52M benchmark (Linear(2560, 2560): 26.2 MB
  // gathered, 13.1 MB per rank on 2 processes): accel's point-to-point messages (Note [Point-to-point all-gather and
  // reduce-scatter] in comm/gloo.hpp) against c10d Gloo's native all-gather and reduce-scatter of the same tensors.
  {
    const std::int64_t part = (2560 * 2561 + env.world_size - 1) / env.world_size;
    at::Tensor mine = at::ones({part}), whole = at::empty({part * env.world_size}),
               grads = at::ones({part * env.world_size});
    add("all_gather_into_unit", compare(
                                    comm, 3, 7, [&] { comm.all_gather_into(whole, mine); },
                                    [&] {
                                      std::vector<at::Tensor> in{mine};
                                      std::vector<std::vector<at::Tensor>> out(1);
                                      for (int r = 0; r < env.world_size; ++r)
                                        out[0].push_back(whole.narrow(0, r * part, part));
                                      pg.allgather(out, in)->wait();
                                    }));
    add("reduce_scatter_unit", compare(
                                   comm, 3, 7, [&] { comm.reduce_scatter(mine, grads); },
                                   [&] {
                                     std::vector<at::Tensor> out{mine};
                                     std::vector<std::vector<at::Tensor>> in(1);
                                     for (int r = 0; r < env.world_size; ++r)
                                       in[0].push_back(grads.narrow(0, r * part, part));
                                     pg.reduce_scatter(out, in)->wait();
                                   }));
  }
  add("rendezvous", {accel_rdzv, raw_rdzv},
      {{"note", "ProcessState (store, arrival census, heartbeat, Gloo mesh) vs TCPStore + ProcessGroupGloo"}});
  if (env.rank == 0) std::ofstream(out_path) << entries.dump(2) << "\n";
  return 0;
}
