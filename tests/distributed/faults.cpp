// Faults (the survivors must end with an error naming the operation and the dead rank, never hang): a peer killed
// mid-collective or mid-training, a peer killed from outside while the others wait for it (they must leave at
// once), a peer frozen (SIGSTOP) mid-training, a peer busy for longer than the peer timeout (not a fault), ranks
// issuing different collectives, a job one process short.
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <thread>

namespace mp {

struct Victim : accel::Accelerator<accel::dist::from_env> {};

// Trains on 400 samples; before the 5th batch the last rank raises `sig` (SIGKILL: dead; SIGSTOP: frozen). The
// survivors must end with an error: reaching the end is a failure.
void train_until_signal(const accel::comm::CommOptions& comm, int sig, const char* what, int victim = -1) {
  Victim acc{accel::Options{.comm = comm}};
  tally.rank = acc.process_index();
  const int N = acc.num_processes();
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  at::manual_seed(1);
  auto [model, opt, loader] =
      acc.prepare(net, torch::optim::SGD(net->parameters(), 0.1),
                  accel::data::DataLoader(accel::data::TensorDataset(at::randn({400, 5}), at::randn({400, 2})),
                                          {.batch_size = 4, .shuffle = true}));
  int step = 0;
  for (const auto& b : loader) {
    if (++step == 5 && tally.rank == (victim < 0 ? N - 1 : victim)) ::raise(sig);
    auto sync = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(b.data), b.target));
    opt.step();
    opt.zero_grad();
  }
  check(false, std::string("survived a ") + what + " peer");
}

// The last rank SIGKILLs itself inside a training loop (inside forward/backward's bucketed all-reduce).
void kill_mid_training(const Args&) { train_until_signal(options(20000).comm, SIGKILL, "dead"); }

// The last rank SIGKILLs itself in the middle of a series of all_reduces.
void kill_mid_collective(const Args&) {
  accel::ProcessState state(options(20000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  for (int i = 0; i < 20; ++i) {
    if (i == 5 && tally.rank == N - 1) ::raise(SIGKILL);
    auto t = F({1.0f});
    state.comm()->all_reduce(t);
  }
  check(false, "survived a dead peer");
}

// The last rank SIGKILLs (ARG kill) or SIGSTOPs (ARG freeze) itself right after starting the second of a series of
// large all-gathers (point-to-point messages, Note [Point-to-point all-gather and reduce-scatter] in comm/gloo.hpp:
// 32 MB per rank, which take tens of milliseconds to move, so the signal lands while they move): the survivors end
// with that all-gather's error naming it (the peer timeout is 5 s), never hang.
void large_all_gather_fault(const Args& args) {
  const bool freeze = arg(args, 0, "kill") == "freeze";
  auto o = options(120000);
  o.comm.peer_timeout = std::chrono::seconds(5);
  accel::ProcessState state(o);
  tally.rank = state.process_index();
  const int N = state.num_processes();
  const std::int64_t n = std::int64_t(8) << 20;
  const at::Tensor part = at::randn({n});
  at::Tensor whole = at::empty({n * N});
  for (int i = 0; i < 4; ++i) {
    auto p = state.comm()->all_gather_into_start(whole, part);
    if (i == 1 && tally.rank == N - 1) ::raise(freeze ? SIGSTOP : SIGKILL);
    state.comm()->finish(p);
  }
  check(false, std::string("survived a ") + (freeze ? "frozen" : "dead") + " peer in a large all-gather");
}

// The others wait in an all_reduce that the last rank never joins; tests/distributed/fault.sh SIGKILLs it from
// outside. They must leave the all_reduce at once with an error naming it, and say when ("left the all_reduce at
// <ms since the epoch>"). With ARG `open`, the last rank first forks a child that keeps its sockets open for 10 s:
// no connection closes when it dies, so only its launcher's report (Note [Ended ranks]) can end the others' wait
// before the peer timeout (10 s here).
void dead_peer(const Args& args) {
  const bool open = arg(args, 0, "") == "open";
  auto o = options(30000);
  o.comm.peer_timeout = std::chrono::seconds(10);
  accel::ProcessState state(o);
  tally.rank = state.process_index();
  const int N = state.num_processes();
  auto warm = F({1.0f});
  state.comm()->all_reduce(warm);  // every rank is connected
  if (tally.rank == N - 1) {
    if (open && ::fork() == 0) {  // the child holds the sockets, not the output (the launcher's pipes)
      ::close(0), ::close(1), ::close(2);
      ::sleep(10);
      ::_exit(0);
    }
    std::cout << "dead-peer: rank " << tally.rank << " (pid " << ::getpid() << ") waits to be killed" << std::endl;
    for (;;) ::pause();
  }
  std::cout << "dead-peer: rank " << tally.rank << " in a long all_reduce" << std::endl;
  auto t = F({1, 2, 3, 4});
  try {
    state.comm()->all_reduce(t);
  } catch (const accel::CommunicationError&) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    std::cout << "dead-peer: rank " << tally.rank << " left the all_reduce at " << ms.count() << " ms" << std::endl;
    throw;
  }
  check(false, "an all_reduce with a dead peer returned");
}

// The last rank freezes itself (SIGSTOP) inside a training loop: the survivors must end within the peer timeout
// (ARG ms) plus a few seconds, naming it, instead of waiting for the collective timeout (120 s here).
void freeze_mid_training(const Args& args) {
  train_until_signal({.timeout = std::chrono::seconds(120),
                      .rendezvous_timeout = std::chrono::seconds(20),
                      .peer_timeout = std::chrono::milliseconds(std::stoi(arg(args, 0, "5000")))},
                     SIGSTOP, "frozen", std::stoi(arg(args, 1, "-1")));
}

// The last rank computes for ARG ms (longer than the 2 s peer timeout) before joining an all_reduce: a busy
// peer keeps beating and is never reported; the others wait and get the right sum.
void busy_peer(const Args& args) {
  auto o = options(60000);
  o.comm.peer_timeout = std::chrono::milliseconds(2000);
  accel::ProcessState state(o);
  tally.rank = state.process_index();
  const int N = state.num_processes();
  if (tally.rank == N - 1) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::stoi(arg(args, 0, "5000")));
    volatile double x = 0;
    while (std::chrono::steady_clock::now() < until) x = x + 1;  // busy, not sleeping
  }
  auto t = F({1.0f, 2.0f});
  state.comm()->all_reduce(t);
  check(same(t, F({float(N), float(2 * N)})), "the all_reduce after a busy peer");
}

// Ranks issue different collectives at the same point (ARG: op, kind, reduce-scatter, gather-start, size or tiny);
// every rank must stop with an error naming both operations (an unchecked one-element all_reduce: at the next checked
// collective).
void mismatch(const Args& args) {
  const std::string what = arg(args, 0, "op");
  auto o = options(60000);
  o.comm.heartbeat_interval = std::chrono::milliseconds(200);
  accel::ProcessState state(o);
  tally.rank = state.process_index();
  auto* comm = state.comm();
  auto warm = F({1.0f});
  comm->all_reduce(warm);  // collective #1 agrees
  const bool odd = tally.rank % 2 == 1;
  if (what == "op") {  // the same size, another reduction: the fingerprint differs
    auto t = F({1, 2, 3, 4});
    comm->all_reduce(t, odd ? accel::comm::ReduceOp::max : accel::comm::ReduceOp::sum);
  } else if (what == "kind") {  // an all_reduce against an all_gather of the same size: Gloo waits for ever
    auto t = at::ones({12});
    if (odd)
      (void)comm->all_gather(t);
    else
      comm->all_reduce(t);
  } else if (what == "tiny") {  // one element carries no check (Gloo's fast path): the next checked collective finds it
    auto t = F({1});
    comm->all_reduce(t, odd ? accel::comm::ReduceOp::max : accel::comm::ReduceOp::sum);
    auto u = F({1, 2, 3, 4});
    comm->all_reduce(u);
  } else if (what == "reduce-scatter") {  // an all_reduce against a reduce_scatter of the same per-rank count
    if (odd) {
      at::Tensor part = at::zeros({4});
      comm->reduce_scatter(part, at::ones({4 * state.num_processes()}));
    } else {
      auto t = F({1, 2, 3, 4});
      comm->all_reduce(t);
    }
  } else if (what == "gather-start") {  // all_gather_into_start of the same bytes, another dtype: found at finish
    at::Tensor out = at::zeros({4 * state.num_processes()}, odd ? at::kInt : at::kFloat);
    auto pending = comm->all_gather_into_start(out, at::ones({4}, out.options()));
    comm->finish(pending);
  } else {  // sizes: Gloo aborts the process whose buffer is too small
    auto t = at::ones({odd ? 10 : 1000});
    comm->all_reduce(t);
  }
  check(false, "returned from mismatched collectives");
}

// Just connect: a job started one process short must fail within the rendezvous timeout, naming the missing rank.
void rendezvous(const Args& args) {
  accel::ProcessState state(options(std::stoi(arg(args, 0, "5000"))));
  tally.rank = state.process_index();
  mark("rendezvous");
}

}  // namespace mp
