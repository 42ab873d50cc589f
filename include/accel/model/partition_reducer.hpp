#pragma once
//! \file
//! `PartitionReducer`: ZeRO stage 2's gradient path (`shard::gradients`), what `DistributedModule` runs instead of
//! its all-reduce buckets when the optimizer's state and gradients are partitioned (optim/sharded.hpp).
//!
//! - The optimizer lays its parameters out in one flat space of N * P elements; rank r owns [r * P, (r + 1) * P)
//!   and holds that partition's gradient (`GradientPartition::own`), nothing more.
//! - Each parameter's range of the flat space is cut at the partition boundaries into pieces; the pieces, taken
//!   from the end of the flat space backwards (roughly the order backward produces them), form buckets of about
//!   `bucket_bytes`, each with one owner.
//! - When every piece of a bucket is ready (in bucket order: every rank issues the same collectives in the same
//!   order), the pieces are copied into a bucket buffer, divided by N, and reduced (sum) to the owner, which adds
//!   the result into its partition's gradient (so gradients accumulate as DDP's do until `zero_grad`). A
//!   parameter's own gradient is released as soon as all its pieces are sent: after a synchronising backward no
//!   rank holds more than its partition's gradients.
//! - At most `kInFlight` buckets travel at once (the oldest is finished before another starts), so the transient
//!   memory is a few buckets, not a second copy of the gradients.
//! - A 16-bit comm hook sends the bucket in fp16/bf16 (cast, then divided by N, as PyTorch's compress hooks do) and
//!   the owner adds it back in the partition's dtype.
//! - `clip_partitioned_norm`: clipping by the global norm of gradients that live in partitions.

#include <accel/comm/communicator.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel {

//! Where a module's gradients go under ZeRO stage 2 (built by `ShardedOptimizer::gradient_partition`).
struct GradientPartition {
  //! Each parameter's first element in the flat space (keyed by its TensorImpl).
  std::unordered_map<const void*, std::int64_t> offsets;
  std::int64_t partition = 0;  //!< P: elements per rank
  at::Tensor own;              //!< this rank's partition of the gradients (P elements, 1-d)

  //! `p`'s first element in the flat space; null when `p` is not in the partition's optimizer.
  [[nodiscard]] const std::int64_t* offset_of(const at::Tensor& p) const {
    const auto it = offsets.find(p.unsafeGetTensorImpl());
    return it == offsets.end() ? nullptr : &it->second;
  }
};

//! ZeRO stage 2's gradient path (`shard::gradients`): reduces gradient buckets to the ranks that own their partitions,
//! instead of all-reducing them (see the file's comment). `DistributedModule` runs it.
class PartitionReducer {
 public:
  //! Buckets that travel at once, at most.
  static constexpr std::size_t kInFlight = 2;

  //! `params`: the module's trainable parameters in `DistributedModule`'s order, with their names (for errors).
  ACCEL_DECL PartitionReducer(comm::Communicator* comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
                              GradientPartition layout, std::int64_t bucket_bytes, c10::ScalarType wire);

  //! The number of buckets.
  [[nodiscard]] std::size_t buckets() const noexcept { return buckets_.size(); }
  //! Bytes one synchronising backward sends (every piece once, in the wire type).
  [[nodiscard]] std::int64_t gradient_bytes() const {
    std::int64_t n = 0;
    for (const auto& b : buckets_) n += b.numel;
    return n * std::int64_t(c10::elementSize(wire_));
  }

  //! Parameter `k`'s gradient is complete: its buckets may go.
  void ready(std::size_t k) {
    for (auto b : params_[k].buckets) ++buckets_[b].ready;
    launch_ready();
  }
  //! Sends every bucket not sent yet (parameters without a gradient contribute zeros) and waits for all:
  //! the owners' partitions hold the sums.
  ACCEL_DECL void complete();
  //! Forgets a backward that failed half-way (the buckets in flight are dropped).
  void reset() {
    for (auto& b : buckets_) b.ready = 0, b.buffer = at::Tensor(), b.pending = {};
    for (auto& p : params_) p.pieces = p.buckets.size();
    in_flight_.clear();
    next_ = 0;
  }

 private:
  struct Piece {
    std::size_t param;
    std::int64_t at, numel;  // elements [at, at + numel) of the parameter
    std::int64_t own_at;     // where they go in the owner's partition
    std::int64_t bucket_at;  // where they travel in the bucket
  };
  struct Bucket {
    std::vector<Piece> pieces;
    int owner = 0;
    std::int64_t numel = 0;
    std::size_t ready = 0;
    at::Tensor buffer;  // while in flight: the pieces (wire type), then room for the collective check
    comm::Communicator::Pending pending;
  };
  struct Param {
    at::Tensor tensor;
    std::vector<std::size_t> buckets;  // one per piece
    std::size_t pieces = 0;            // pieces not sent yet in this backward
  };

  void launch_ready() {
    while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].pieces.size()) {
      if (in_flight_.size() >= kInFlight) finish_oldest();
      launch(next_++);
    }
  }
  ACCEL_DECL void launch(std::size_t i);
  ACCEL_DECL void finish_oldest();

  comm::Communicator* comm_;
  GradientPartition layout_;
  c10::ScalarType wire_;
  std::vector<Bucket> buckets_;
  std::vector<Param> params_;
  std::deque<std::size_t> in_flight_;
  std::size_t next_ = 0;
};

// [torch:nn/utils/clip_grad.py clip_grad_norm_]
//! `clip_grad_norm_` over gradients of which this rank holds `parts` (ZeRO stage 2: its partition's pieces; the
//! other ranks hold the rest) and `whole` ones (the same on every rank): the total `norm_type`-norm of all of them
//! (one all-reduce, on every rank), every gradient scaled by min(1, max_norm / (norm + 1e-6)) as PyTorch does.
//! Returns the norm before clipping.
inline double clip_partitioned_norm(comm::Communicator* comm, std::vector<at::Tensor>& parts,
                                    std::vector<at::Tensor>& whole, double max_norm, double norm_type) {
  const bool inf = std::isinf(norm_type);
  const auto where = comm ? comm->device() : c10::Device(c10::kCPU);
  auto local = [&](const std::vector<at::Tensor>& gs) {  // sum of |g|^p (max |g| for inf), in double
    if (gs.empty()) return at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(where));
    std::vector<at::Tensor> norms;
    for (const auto& g : gs) norms.push_back(at::linalg_vector_norm(g, norm_type).to(where, at::kDouble).reshape({1}));
    const at::Tensor n = at::cat(norms);
    return inf ? n.max().reshape({1}) : n.pow(norm_type).sum().reshape({1});
  };
  at::Tensor shared = local(parts);
  if (comm && comm->size() > 1) comm->all_reduce(shared, inf ? comm::ReduceOp::max : comm::ReduceOp::sum);
  const at::Tensor mine = local(whole);
  const double total = inf ? std::max(shared.item<double>(), mine.item<double>())
                           : std::pow(shared.item<double>() + mine.item<double>(), 1.0 / norm_type);
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  if (coef < 1.0) {
    for (auto& g : parts) g.mul_(coef);
    for (auto& g : whole) g.mul_(coef);
  }
  return total;
}

}  // namespace accel

#if ACCEL_DEFINITIONS
#include <accel/model/impl/partition_reducer.ipp>
#endif
