#pragma once
// The multi-process test harness: every rank counts its checks and prints "rank R: N passed, M failed" at the end
// (ctest passes a test when rank 0 reports no failure and no rank reports one). Each mode is a function of one file
// of tests/distributed, named after what it tests; main.cpp maps mode names to them.
#include <accel/error.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace mp {

struct Tally {
  int passed = 0, failed = 0, rank = 0;
};
inline Tally tally;

inline void check(bool ok, const std::string& what) {
  if (ok)
    ++tally.passed;
  else {
    ++tally.failed;
    std::cerr << "FAILED on rank " << tally.rank << ": " << what << std::endl;
  }
}
//! A progress marker, not a check: "rank R reached: WHAT" on stdout, for the scripts that follow a job's progress.
inline void mark(const std::string& what) { std::cout << "rank " << tally.rank << " reached: " << what << std::endl; }
//! CTest's SKIP_RETURN_CODE of the tests whose machine lacks something (a GPU): `skip` prints "SKIPPED: WHY" and
//! exits with it before the mode joins its job.
inline constexpr int skip_code = 77;
[[noreturn]] inline void skip(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(skip_code);
}
inline at::Tensor T(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
inline at::Tensor F(std::vector<float> v) { return at::tensor(v, at::kFloat); }
inline bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
}

//! A batch's sample ids as objects, one string per sample (what a metric computed off the device looks like).
inline std::vector<std::string> sample_names(const at::Tensor& ids) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < ids.size(0); ++i) out.push_back("sample-" + std::to_string(ids[i].item<int64_t>()));
  return out;
}

//! Process options with one timeout for the rendezvous and every collective.
inline accel::ProcessOptions options(int timeout_ms) {
  accel::ProcessOptions o;
  o.comm.timeout = std::chrono::milliseconds(timeout_ms);
  o.comm.rendezvous_timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

//! A mode's arguments: what follows the mode's name on the command line.
using Args = std::vector<std::string>;
inline std::string arg(const Args& a, std::size_t i, std::string otherwise) { return i < a.size() ? a[i] : otherwise; }

// The modes, one per file.
void collectives(const Args&);                // comm/collectives.cpp
void sharding_collectives(const Args&);       // comm/sharding.cpp
void zero(const Args&);                       // optim/zero.cpp
void gather_for_metrics(const Args&);         // comm/gather_for_metrics.cpp
void golden_e2e(const Args&);                 // data/golden_e2e.cpp
void golden_e2e_stream(const Args&);          // data/golden_e2e.cpp
void dispatch(const Args&);                   // data/dispatch.cpp
void streams(const Args&);                    // data/streams.cpp
void distributed_module(const Args&);         // model/distributed_module.cpp
void ddp_buffers(const Args&);                // model/ddp_buffers.cpp
void fully_sharded(const Args&);              // model/fully_sharded.cpp
void fully_sharded_edges(const Args&);        // model/fully_sharded.cpp
void fully_sharded_bypass(const Args&);       // model/fully_sharded.cpp
void fully_sharded_kill(const Args&);         // model/fully_sharded.cpp
void fully_sharded_checkpoints(const Args&);  // model/fully_sharded.cpp
void fully_sharded_mixed(const Args&);        // model/fully_sharded.cpp
void checkpointed_units(const Args&);         // model/activation_checkpoint.cpp
void comm_hooks(const Args&);                 // model/comm_hooks.cpp
void sync_batch_norm(const Args&);            // model/sync_batch_norm.cpp
void replicas(const Args&);                   // model/replicas.cpp
void accelerator(const Args&);                // accelerator.cpp
void helpers(const Args&);                    // accelerator.cpp
void kill_mid_collective(const Args&);        // faults.cpp
void kill_mid_training(const Args&);          // faults.cpp
void dead_peer(const Args&);                  // faults.cpp
void rendezvous(const Args&);                 // faults.cpp
void freeze_mid_training(const Args&);        // faults.cpp
void large_all_gather_fault(const Args&);     // faults.cpp
void busy_peer(const Args&);                  // faults.cpp
void mismatch(const Args&);                   // faults.cpp
void uneven(const Args&);                     // uneven.cpp
void elastic(const Args&);                    // launch.cpp
void preemptible(const Args&);                // launch.cpp
void listening_surface(const Args&);          // security.cpp
void foreign_writer(const Args&);             // security.cpp
void attacked_job(const Args&);               // security.cpp
void job_sum(const Args&);                    // security.cpp
void store_host(const Args&);                 // security.cpp
void files(const Args&);                      // files.cpp
void resize_loaders(const Args&);             // data/resize.cpp
void resize_training(const Args&);            // data/resize.cpp
void nccl(const Args&);                       // cuda/nccl.cpp

}  // namespace mp
