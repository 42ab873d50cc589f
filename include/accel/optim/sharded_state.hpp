#pragma once
//! \file
//! The parts of `ShardedOptimizer` (optim/sharded.hpp) that move a partition's optimizer state between processes
//! for one optimizer's state type: `reshard_as` (a checkpoint of another number of processes, re-cut) and
//! `consolidate_as` (every partition, assembled on one rank). Included by optim/sharded.hpp.

#include <accel/optim/sharded.hpp>

namespace accel {

// load_resharded() and consolidate() for the state type `S` (ShardTraits<O>::State).
template <class S>
void ShardedOptimizer::reshard_as(std::vector<torch::serialize::InputArchive>& parts) {
  if (stage_ == 3) return reshard_pieces_as<S>(parts);
  c10::AutoGradMode no_grad(false);
  const std::int64_t n = std::int64_t(parts.size()), old_part = (total_ + n - 1) / n, G = std::int64_t(shards_.size());
  const std::int64_t F = detail::state_tensor_count<S>();
  std::vector<std::vector<at::Tensor>> fields(static_cast<std::size_t>(G),
                                              std::vector<at::Tensor>(static_cast<std::size_t>(F)));
  std::vector<std::int64_t> steps(static_cast<std::size_t>(G), -1);  // -1: no saved state for the group's new shard
  for (std::int64_t k = 0; k < n; ++k) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    std::vector<std::pair<std::int64_t, std::int64_t>> bounds;  // saved rank k's shard of each group
    for (std::int64_t g = 0; g < G; ++g) {
      const Shard& sh = shards_[std::size_t(g)];
      const std::int64_t lo = std::max(sh.group_begin, k * old_part), hi = std::min(sh.group_end, (k + 1) * old_part);
      bounds.emplace_back(lo, hi);
      std::vector<at::Tensor> params;
      if (lo < hi) params.push_back(at::zeros({hi - lo}, flat_.options()));
      groups.emplace_back(std::move(params), user_->param_groups()[std::size_t(g)].options().clone());
    }
    auto saved = make_(std::move(groups));
    torch::serialize::InputArchive inner;
    parts[std::size_t(k)].read("partition", inner);
    saved->load(inner);
    for (std::int64_t g = 0; g < G; ++g) {
      const Shard& sh = shards_[std::size_t(g)];
      const auto [lo, hi] = bounds[std::size_t(g)];
      const std::int64_t a = std::max(lo, sh.begin), b = std::min(hi, sh.end);
      if (a >= b) continue;  // nothing of saved rank k's shard is in this rank's new one
      const auto& t = saved->param_groups()[std::size_t(g)].params().front();
      const auto it = saved->state().find(t.unsafeGetTensorImpl());
      if (it == saved->state().end()) continue;
      auto& st = static_cast<S&>(*it->second);
      steps[std::size_t(g)] = std::max(steps[std::size_t(g)], detail::state_step(st));
      std::int64_t i = 0;
      detail::state_tensors(st, [&](const at::Tensor& v, auto&&) {
        auto& f = fields[std::size_t(g)][std::size_t(i++)];
        if (!v.defined()) return;
        if (!f.defined()) f = at::zeros({sh.end - sh.begin}, v.options());
        f.narrow(0, a - sh.begin, b - a).copy_(v.reshape({-1}).narrow(0, a - lo, b - a));
      });
    }
  }
  inner_->state().clear();
  for (std::int64_t g = 0; g < G; ++g) {
    const Shard& sh = shards_[std::size_t(g)];
    if (sh.tensor.defined() && steps[std::size_t(g)] >= 0)
      install_state<S>(sh.tensor, steps[std::size_t(g)], fields[std::size_t(g)]);
  }
}

template <class S>
void ShardedOptimizer::install_state(const at::Tensor& tensor, std::int64_t step,
                                     const std::vector<at::Tensor>& fields) {
  auto st = std::make_unique<S>();
  detail::set_state_step(*st, step);
  std::size_t f = 0;
  detail::state_tensors(*st, [&](const at::Tensor&, auto&& set) {
    const at::Tensor& v = fields[f++];
    if (v.defined()) set(v);
  });
  inner_->state()[tensor.unsafeGetTensorImpl()] = std::move(st);
}

// Stage 3: saved rank k of n held, of each parameter, the elements of its unit's [k * P', (k + 1) * P') (P' =
// ceil(unit elements / n)); its inner optimizer stepped those pieces in group order, skipping empty ones. Each is
// rebuilt so, loaded, and the part of every state tensor that falls in this rank's piece copied there.
template <class S>
void ShardedOptimizer::reshard_pieces_as(std::vector<torch::serialize::InputArchive>& parts) {
  c10::AutoGradMode no_grad(false);
  const std::int64_t n = std::int64_t(parts.size()), Q = std::int64_t(pieces_.size());
  const std::int64_t F = detail::state_tensor_count<S>();
  std::vector<std::vector<at::Tensor>> fields(static_cast<std::size_t>(Q),
                                              std::vector<at::Tensor>(static_cast<std::size_t>(F)));
  std::vector<std::int64_t> steps(static_cast<std::size_t>(Q), -1);
  const auto& user_groups = user_->param_groups();
  for (std::int64_t k = 0; k < n; ++k) {
    std::vector<at::Tensor> tensor_of;                          // each piece's tensor in saved rank k's optimizer
    std::vector<std::pair<std::int64_t, std::int64_t>> bounds;  // saved rank k's piece of each parameter
    std::vector<std::vector<at::Tensor>> params(user_groups.size());
    for (const auto& q : pieces_) {
      const std::int64_t part = (q.unit_total + n - 1) / n;
      const std::int64_t lo = std::max(q.offset, k * part), hi = std::min(q.offset + q.param.numel(), (k + 1) * part);
      bounds.emplace_back(lo - q.offset, hi - q.offset);
      at::Tensor t;
      if (lo < hi) {
        t = at::zeros({hi - lo}, q.param.options().requires_grad(false));
        params[q.group].push_back(t);
      }
      tensor_of.push_back(t);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (std::size_t g = 0; g < params.size(); ++g) groups.emplace_back(params[g], user_groups[g].options().clone());
    auto saved = make_(std::move(groups));
    torch::serialize::InputArchive inner;
    parts[std::size_t(k)].read("partition", inner);
    saved->load(inner);
    for (std::int64_t i = 0; i < Q; ++i) {
      const auto& q = pieces_[std::size_t(i)];
      const auto [lo, hi] = bounds[std::size_t(i)];
      const std::int64_t a = std::max(lo, q.at), b = std::min(hi, q.at + q.numel);
      if (!q.shard.defined() || !tensor_of[std::size_t(i)].defined() || a >= b) continue;
      const auto it = saved->state().find(tensor_of[std::size_t(i)].unsafeGetTensorImpl());
      if (it == saved->state().end()) continue;
      auto& st = static_cast<S&>(*it->second);
      steps[std::size_t(i)] = std::max(steps[std::size_t(i)], detail::state_step(st));
      std::int64_t f = 0;
      detail::state_tensors(st, [&](const at::Tensor& v, auto&&) {
        auto& out = fields[std::size_t(i)][std::size_t(f++)];
        if (!v.defined()) return;
        if (!out.defined()) out = at::zeros({q.numel}, v.options());
        out.narrow(0, a - q.at, b - a).copy_(v.reshape({-1}).narrow(0, a - lo, b - a));
      });
    }
  }
  inner_->state().clear();
  for (std::int64_t i = 0; i < Q; ++i) {
    const auto& q = pieces_[std::size_t(i)];
    if (q.shard.defined() && steps[std::size_t(i)] >= 0)
      install_state<S>(q.shard, steps[std::size_t(i)], fields[std::size_t(i)]);
  }
}

template <class S>
void ShardedOptimizer::consolidate_as(int to) {
  c10::AutoGradMode no_grad(false);
  const std::int64_t G = std::int64_t(shards_.size());
  const std::int64_t F = detail::state_tensor_count<S>();
  // Per group: [step, present(tensor 0), ..., present(tensor F - 1)].
  at::Tensor desc = at::zeros({G, 1 + F}, at::TensorOptions().dtype(at::kLong));
  auto d = desc.accessor<std::int64_t, 2>();
  for (std::int64_t g = 0; g < G; ++g) {
    const Shard& sh = shards_[std::size_t(g)];
    if (!sh.tensor.defined()) continue;
    const auto it = inner_->state().find(sh.tensor.unsafeGetTensorImpl());
    if (it == inner_->state().end()) continue;
    auto& st = static_cast<S&>(*it->second);
    d[g][0] = detail::state_step(st);
    std::int64_t i = 0;
    detail::state_tensors(st, [&](const at::Tensor& t, auto&&) { d[g][1 + i++] = t.defined() ? 1 : 0; });
  }
  if (processes() > 1) {
    at::Tensor moving = desc.to(comm_->device());
    comm_->all_reduce(moving, comm::ReduceOp::max);
    desc.copy_(moving);
  }
  const bool root = rank() == to;
  if (root) user_->state().clear();
  for (std::int64_t g = 0; g < G; ++g) {
    const Shard& sh = shards_[std::size_t(g)];
    const std::int64_t len = sh.group_end - sh.group_begin;
    std::vector<at::Tensor> whole(static_cast<std::size_t>(F));  // on the root: the group's state tensors, whole
    for (std::int64_t i = 0; i < F; ++i) {
      if (d[g][1 + i] == 0) continue;
      const std::int64_t room = processes() > 1 ? comm_->check_room(flat_.scalar_type(), len) : 0;
      at::Tensor buffer = at::zeros({len + room}, flat_.options());
      if (sh.tensor.defined()) {
        auto& st = static_cast<S&>(*inner_->state().at(sh.tensor.unsafeGetTensorImpl()));
        std::int64_t k = 0;
        detail::state_tensors(st, [&](const at::Tensor& t, auto&&) {
          if (k++ == i) buffer.narrow(0, sh.begin - sh.group_begin, sh.end - sh.begin).copy_(t.reshape({-1}));
        });
      }
      if (processes() > 1) {
        auto pending = comm_->reduce_start(buffer, len, to);
        comm_->finish(pending);
      }
      if (root) whole[std::size_t(i)] = buffer.narrow(0, 0, len);
    }
    bool any = false;
    for (std::int64_t i = 0; i <= F; ++i) any = any || d[g][i] != 0;
    if (!root || !any) continue;  // never stepped: no state
    for (const auto& slot : slots_) {
      if (slot.offset < sh.group_begin || slot.offset >= sh.group_end) continue;
      auto st = std::make_unique<S>();
      detail::set_state_step(*st, d[g][0]);
      std::int64_t i = 0;
      detail::state_tensors(*st, [&](const at::Tensor&, auto&& set) {
        const at::Tensor& w = whole[std::size_t(i++)];
        if (w.defined()) set(w.narrow(0, slot.offset - sh.group_begin, slot.numel).view(slot.param.sizes()).clone());
      });
      user_->state()[slot.param.unsafeGetTensorImpl()] = std::move(st);
    }
  }
}

}  // namespace accel
