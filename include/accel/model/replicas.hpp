#pragma once
//! \file
//! Replicas that drift, found: a cheap, exact fingerprint of a model's parameters and the comparison of the
//! processes' fingerprints (`Options::check_replicas_every`; the accelerator runs it at a step boundary).
//!
//! Note [Replica check]
//! Data-parallel replicas stay bit-identical only while every process applies the same update to the same bits.
//! Anything that changes the weights on one rank alone (an optimizer stepped outside accel inside an accumulation
//! window, a nondeterministic kernel, a rank-dependent branch in user code) makes them diverge, silently, in every
//! framework. The check fingerprints each parameter by its bits: the bytes read as integers of the element's width,
//! summed and summed as squares in 64-bit integers, wrapping. Integer sums are exact and independent of the order of
//! summation, so equal bits give equal fingerprints on any machine and thread count, and a single changed element
//! changes the sums except with negligible chance. The processes all-gather the fingerprints (2 integers per
//! parameter) and each compares them, so every process stops together, with the same `ReplicaDivergence` naming the
//! first parameter that differs, the ranks that disagree with rank 0, and the optimizer steps between which it
//! happened. Buffers are not compared: under DDP each rank keeps its own running statistics between forwards.

#include <accel/comm/communicator.hpp>
#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel {

//! The processes' parameters differ (Note [Replica check]); the same error on every process.
struct ReplicaDivergence : Error {
  using Error::Error;
};

//! One row per tensor: (sum of its words, sum of their squares) as 64-bit wrapping integer sums of its bits read
//! as integers of its element's width (Note [Replica check]). A `[n, 2]` int64 tensor on the tensors' device (the
//! first tensor's; CPU when there is none).
inline at::Tensor replica_fingerprint(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> rows;
  rows.reserve(tensors.size());
  for (const auto& t : tensors) {
    const auto bits = t.element_size() == 8   ? at::kLong
                      : t.element_size() == 4 ? at::kInt
                      : t.element_size() == 2 ? at::kShort
                                              : at::kChar;
    const at::Tensor words = t.detach().contiguous().view(bits).to(at::kLong);
    rows.push_back(at::stack({words.sum(), at::mul(words, words).sum()}));
  }
  if (rows.empty()) return at::empty({0, 2}, at::TensorOptions().dtype(at::kLong));
  return at::stack(rows);
}

//! Where the processes' fingerprints (`replica_fingerprint` of each, in rank order) first differ: the row and the
//! ranks whose row differs from rank 0's; nothing when all agree.
struct ReplicaMismatch {
  std::int64_t row = 0;    //!< the first row (parameter) that differs
  std::vector<int> ranks;  //!< the ranks whose row differs from rank 0's
};
//! Compares the processes' fingerprints (see `ReplicaMismatch`).
inline std::optional<ReplicaMismatch> compare_replicas(const std::vector<at::Tensor>& per_rank) {
  if (per_rank.size() < 2) return std::nullopt;
  std::vector<at::Tensor> cpu;
  for (const auto& t : per_rank) cpu.push_back(t.to(at::kCPU).contiguous());
  const std::int64_t rows = cpu[0].size(0);
  const auto* lead = cpu[0].data_ptr<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    ReplicaMismatch m{r, {}};
    for (std::size_t k = 1; k < cpu.size(); ++k) {
      const auto* other = cpu[k].data_ptr<std::int64_t>();
      if (cpu[k].size(0) != rows || other[2 * r] != lead[2 * r] || other[2 * r + 1] != lead[2 * r + 1])
        m.ranks.push_back(int(k));
    }
    if (!m.ranks.empty()) return m;
  }
  return std::nullopt;
}

//! Compares `named` (the parameters of every prepared model, in the same order on every process) across the
//! processes of `comm` (a collective: every process calls it at the same point); throws `ReplicaDivergence` on every
//! process when they differ. `step` is the number of synchronising training steps taken (optimizer steps), `agreed`
//! the number at the last check that passed. Nothing with one process.
inline void check_replicas(comm::Communicator* comm, const std::vector<std::pair<std::string, at::Tensor>>& named,
                           std::uint64_t step, std::uint64_t agreed) {
  if (!comm || comm->size() < 2) return;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, t] : named) tensors.push_back(t);
  at::Tensor mine = replica_fingerprint(tensors).to(comm->device());
  const auto all = comm->all_gather(mine);
  const auto m = compare_replicas(all);
  if (!m) return;
  std::string ranks;
  for (const int r : m->ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw ReplicaDivergence(
      "accel: the processes' replicas differ after optimizer step " + std::to_string(step) +
      " (they were equal after step " + std::to_string(agreed) + "): parameter '" + named[std::size_t(m->row)].first +
      "' on rank(s) " + ranks + " differs from rank 0's (the first of " + std::to_string(named.size()) +
      " parameters compared). Something changed the "
      "weights on some processes only: an optimizer that accel did not prepare (step the one prepare() returned), a "
      "rank-dependent change in the loop, or a nondeterministic kernel. Options::check_replicas_every = 1 finds the "
      "first "
      "step");
}

}  // namespace accel
