#pragma once
//! \file
//! The definitions of `PartitionReducer`'s constructor and larger members (model/partition_reducer.hpp, included at its
//! end), kept out of user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for
//! their cost: 6 MB of g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/model/partition_reducer.hpp>

namespace accel {

ACCEL_DECL PartitionReducer::PartitionReducer(comm::Communicator* comm,
                                              const std::vector<std::pair<std::string, at::Tensor>>& params,
                                              GradientPartition layout, std::int64_t bucket_bytes, c10::ScalarType wire)
    : comm_(comm), layout_(std::move(layout)), wire_(wire) {
  const std::int64_t P = layout_.partition;
  detail::require(
      P > 0 && layout_.own.defined() && layout_.own.numel() == P,
      "accel::PartitionReducer: the gradient partition is not laid out (build the sharded optimizer first)");
  struct Cut {  // a parameter's elements [at, at + numel), at `flat` in the flat space
    std::size_t param;
    std::int64_t at, numel, flat;
  };
  std::vector<Cut> pieces;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto& [name, t] = params[k];
    const std::int64_t* off = layout_.offset_of(t);
    detail::require(off != nullptr,
                    "accel::shard::gradients: parameter '" + name +
                        "' of a prepared model is not in the sharded "
                        "optimizer that holds the model's other parameters, so its gradient has no owner; under "
                        "ZeRO stage 2 a model's trainable parameters belong to one optimizer (use parameter groups "
                        "for different options), or freeze it (requires_grad false)");
    params_.push_back({t});
    for (std::int64_t lo = *off, end = *off + t.numel(); lo < end;) {
      const std::int64_t hi = std::min(end, (lo / P + 1) * P);
      pieces.push_back({k, lo - *off, hi - lo, lo});
      lo = hi;
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const Cut& a, const Cut& b) { return a.flat > b.flat; });
  const std::int64_t element = std::int64_t(layout_.own.element_size());
  for (const auto& pc : pieces) {
    const int owner = int(pc.flat / P);
    if (buckets_.empty() || buckets_.back().owner != owner ||
        (buckets_.back().numel + pc.numel) * element > bucket_bytes)
      buckets_.push_back({{}, owner});
    auto& b = buckets_.back();
    b.pieces.push_back({pc.param, pc.at, pc.numel, pc.flat - std::int64_t(owner) * P, b.numel});
    b.numel += pc.numel;
    params_[pc.param].buckets.push_back(buckets_.size() - 1);
  }
  for (auto& p : params_) p.pieces = p.buckets.size();
}

ACCEL_DECL void PartitionReducer::complete() {
  try {
    for (auto& b : buckets_) b.ready = b.pieces.size();
    launch_ready();
    while (!in_flight_.empty()) finish_oldest();
  } catch (...) {
    reset();
    throw;
  }
  reset();
}

ACCEL_DECL void PartitionReducer::launch(std::size_t i) {
  c10::AutoGradMode no_grad(false);
  auto& b = buckets_[i];
  const std::int64_t room = comm_->check_room(wire_, b.numel);
  b.buffer = at::empty({b.numel + room}, layout_.own.options().dtype(wire_));
  for (const auto& pc : b.pieces) {
    auto& p = params_[pc.param];
    at::Tensor dst = b.buffer.narrow(0, pc.bucket_at, pc.numel);
    const at::Tensor& g = p.tensor.grad();
    if (g.defined())
      dst.copy_(g.reshape({-1}).narrow(0, pc.at, pc.numel));
    else
      dst.zero_();
    if (--p.pieces == 0) p.tensor.mutable_grad() = at::Tensor();  // sent whole: released
  }
  at::Tensor payload = b.buffer.narrow(0, 0, b.numel);
  if (wire_ == layout_.own.scalar_type())
    payload.mul_(1.0 / double(comm_->size()));  // as DDP's bucket
  else
    payload.div_(comm_->size());  // as the compress hooks
  b.pending = comm_->reduce_start(b.buffer, b.numel, b.owner);
  in_flight_.push_back(i);
}

ACCEL_DECL void PartitionReducer::finish_oldest() {
  auto& b = buckets_[in_flight_.front()];
  in_flight_.pop_front();
  comm_->finish(b.pending);
  if (b.owner == comm_->rank()) {
    c10::AutoGradMode no_grad(false);
    for (const auto& pc : b.pieces)
      layout_.own.narrow(0, pc.own_at, pc.numel).add_(b.buffer.narrow(0, pc.bucket_at, pc.numel));
  }
  b.buffer = at::Tensor();
}

}  // namespace accel
