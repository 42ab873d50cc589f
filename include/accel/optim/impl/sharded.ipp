#pragma once
//! \file
//! The definitions of `ShardedOptimizer`'s larger members (optim/sharded.hpp, included at its end), kept out of user
//! code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for their cost: 6 MB of
//! g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/optim/sharded.hpp>

namespace accel {

ACCEL_DECL void ShardedOptimizer::build() {
  if (inner_) return;
  const int n = processes(), r = rank();
  detail::require(unstepped(*user_),
                  "accel::ShardedOptimizer: the optimizer already has state (it stepped before "
                  "prepare); prepare it before its first step, so that each process builds the state "
                  "of its partition only");
  std::unordered_set<const void*> seen;
  const auto& groups = user_->param_groups();
  std::vector<std::int64_t> group_begin, group_end;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    group_begin.push_back(total_);
    for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
      const at::Tensor& p = groups[g].params()[k];
      const std::string where =
          "parameter " + std::to_string(k) + " of group " + std::to_string(g) + " (" + describe(p) + ")";
      detail::require(p.requires_grad(),
                      "accel::ShardedOptimizer: " + where +
                          " does not require a gradient; ZeRO steps a flat "
                          "partition of every parameter: leave frozen parameters out of the optimizer");
      detail::require(seen.insert(p.unsafeGetTensorImpl()).second,
                      "accel::ShardedOptimizer: " + where + " is listed twice");
      if (!slots_.empty())
        detail::require(
            p.scalar_type() == slots_.front().param.scalar_type() && p.device() == slots_.front().param.device(),
            "accel::ShardedOptimizer: " + where + " differs in dtype or device from the first parameter (" +
                describe(slots_.front().param) + "); ZeRO keeps one flat buffer: use one dtype and one device");
      slots_.push_back({p, where, total_, p.numel()});
      total_ += p.numel();
    }
    group_end.push_back(total_);
  }
  detail::require(total_ > 0, "accel::ShardedOptimizer: the optimizer has no parameter elements to shard");
  user_->state().clear();  // Adagrad's initial sums: the inner optimizer makes those of this partition
  part_ = (total_ + n - 1) / n;
  begin_ = std::int64_t(r) * part_, end_ = begin_ + part_;
  c10::AutoGradMode no_grad(false);
  const at::Tensor& first = slots_.front().param;
  flat_ = at::zeros({part_ * n}, first.options().requires_grad(false));
  grads_ = at::zeros({part_}, flat_.options());
  for (const auto& s : slots_) bind(s);
  std::vector<torch::optim::OptimizerParamGroup> mine;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    Shard s;
    s.begin = std::max(group_begin[g], begin_), s.end = std::min(group_end[g], end_);
    s.group_begin = group_begin[g], s.group_end = group_end[g];
    std::vector<at::Tensor> params;
    if (s.begin < s.end) {
      s.tensor = detail::alias_of(flat_, s.begin, {s.end - s.begin});
      s.tensor.mutable_grad() = detail::alias_of(grads_, s.begin - begin_, {s.end - s.begin});
      params.push_back(s.tensor);
    }
    shards_.push_back(s);
    mine.emplace_back(std::move(params), groups[g].options().clone());
  }
  inner_ = make_(std::move(mine));
}

ACCEL_DECL void ShardedOptimizer::build_over(
    const std::function<const UnitSharder::Piece*(const at::Tensor&)>& piece_of) {
  if (inner_) return;
  detail::require(stage_ == 3, "accel::ShardedOptimizer: build_over() is stage 3's (shard::parameters)");
  detail::require(unstepped(*user_),
                  "accel::ShardedOptimizer: the optimizer already has state (it stepped before "
                  "prepare); prepare it before its first step, so that each process builds the state "
                  "of its partition only");
  user_->state().clear();
  std::unordered_set<const void*> seen;
  const auto& groups = user_->param_groups();
  std::vector<torch::optim::OptimizerParamGroup> mine;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> params;
    for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
      const at::Tensor& p = groups[g].params()[k];
      const std::string where =
          "parameter " + std::to_string(k) + " of group " + std::to_string(g) + " (" + describe(p) + ")";
      detail::require(seen.insert(p.unsafeGetTensorImpl()).second,
                      "accel::ShardedOptimizer: " + where + " is listed twice");
      const UnitSharder::Piece* piece = piece_of(p);
      detail::require(piece != nullptr, "accel::ShardedOptimizer: " + where +
                                            " belongs to no model prepared under accel::shard::parameters; "
                                            "prepare the model that holds it in the same prepare() call");
      detail::require(p.requires_grad(), "accel::ShardedOptimizer: " + where +
                                             " does not require a gradient; leave frozen parameters out of the "
                                             "optimizer");
      total_ += p.numel();
      pieces_.push_back({p, piece->grad, piece->shard, g, piece->unit_total, piece->offset, piece->at, piece->numel});
      if (!piece->shard.defined()) continue;  // none of it on this rank
      at::Tensor t = piece->shard;
      t.mutable_grad() = piece->grad;
      params.push_back(t);
      part_ += piece->numel;
    }
    mine.emplace_back(std::move(params), groups[g].options().clone());
  }
  inner_ = make_(std::move(mine));
}

ACCEL_DECL void ShardedOptimizer::step() {
  detail::require(inner_ != nullptr, "accel::ShardedOptimizer: step() before build()");
  c10::AutoGradMode no_grad(false);
  if (stage_ == 1) take_gradients();
  auto& theirs = user_->param_groups();
  auto& ours = inner_->param_groups();
  for (std::size_t g = 0; g < ours.size(); ++g) ours[g].set_options(theirs[g].options().clone());
  inner_->step();
  gather();
}

ACCEL_DECL GradientPartition ShardedOptimizer::gradient_partition() const {
  detail::require(inner_ != nullptr, "accel::ShardedOptimizer: gradient_partition() before build()");
  GradientPartition g;
  for (const auto& s : slots_) g.offsets.emplace(s.param.unsafeGetTensorImpl(), s.offset);
  g.partition = part_;
  g.own = grads_;
  return g;
}

ACCEL_DECL std::vector<at::Tensor> ShardedOptimizer::owned_gradients(const std::vector<at::Tensor>& params,
                                                                     std::unordered_set<const void*>& covered) const {
  std::unordered_set<const void*> wanted;
  for (const auto& p : params) wanted.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> out;
  for (const auto& p : pieces_) {  // stage 3
    if (!wanted.count(p.param.unsafeGetTensorImpl())) continue;
    covered.insert(p.param.unsafeGetTensorImpl());
    if (p.grad.defined()) out.push_back(p.grad);
  }
  for (const auto& s : slots_) {
    if (!wanted.count(s.param.unsafeGetTensorImpl())) continue;
    covered.insert(s.param.unsafeGetTensorImpl());
    const std::int64_t lo = std::max(s.offset, begin_), hi = std::min(s.offset + s.numel, end_);
    if (lo < hi) out.push_back(grads_.narrow(0, lo - begin_, hi - lo));
  }
  return out;
}

ACCEL_DECL void ShardedOptimizer::take_gradients() {
  for (const auto& s : slots_)
    if (!s.param.grad().defined())
      throw InvalidArgument(
          "accel::ShardedOptimizer: " + s.name +
          " has no gradient at this step; ZeRO steps every "
          "parameter's partition: use every parameter in the loss (or set Options::find_unused_parameters, "
          "which gives unused ones zero gradients), or leave it out of the optimizer");
  for (const auto& s : slots_) {
    const std::int64_t lo = std::max(s.offset, begin_), hi = std::min(s.offset + s.numel, end_);
    if (lo >= hi) continue;
    grads_.narrow(0, lo - begin_, hi - lo).copy_(s.param.grad().reshape({-1}).narrow(0, lo - s.offset, hi - lo));
  }
}

ACCEL_DECL void ShardedOptimizer::save(torch::serialize::OutputArchive& a) const {
  a.write("zero_stage", c10::IValue(std::int64_t(stage_)));
  a.write("zero_processes", c10::IValue(std::int64_t(processes())));
  a.write("zero_rank", c10::IValue(std::int64_t(rank())));
  a.write("zero_total", c10::IValue(total_));
  if (stage_ == 3) a.write("zero_units", unit_layout());  // what the pieces were cut from
  torch::serialize::OutputArchive inner(a.compilation_unit());
  inner_->save(inner);
  a.write("partition", inner);
}

ACCEL_DECL void ShardedOptimizer::consolidate(int to) {
  detail::require(inner_ != nullptr, "accel::ShardedOptimizer: consolidate() before build()");
  detail::require(stage_ != 3,
                  "accel::ShardedOptimizer: consolidating the state of a fully sharded model's optimizer "
                  "(shard::parameters) on one process is not supported; save it with save_state, which keeps "
                  "each process's part");
  detail::require(bool(consolidate_),
                  "accel::ShardedOptimizer: consolidate() needs the optimizer's type (construct the "
                  "ShardedOptimizer from a std::shared_ptr of one of the types with ShardTraits)");
  detail::require(to >= 0 && to < processes(), "accel::ShardedOptimizer: consolidate(" + std::to_string(to) +
                                                   "): no such rank among " + std::to_string(processes()));
  consolidate_(to);
}

ACCEL_DECL void ShardedOptimizer::check_resharded(std::vector<torch::serialize::InputArchive>& parts) const {
  detail::require(bool(reshard_),
                  "accel::ShardedOptimizer: resuming at another number of processes needs the optimizer's "
                  "type (construct the ShardedOptimizer from a std::shared_ptr of a type with ShardTraits)");
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto [stage, procs, r, total] = layout_of(parts[k]);
    const bool same_layout = stage_ == 3 ? stage == 3 : (stage == 1 || stage == 2);
    if (!same_layout || procs != std::int64_t(parts.size()) || r != std::int64_t(k) || total != total_)
      throw InvalidArgument("accel::ShardedOptimizer: mismatched partitions: partition file " + std::to_string(k) +
                            " of " + std::to_string(parts.size()) + " holds rank " + std::to_string(r) +
                            "'s partition of " + std::to_string(procs) + " processes over " + std::to_string(total) +
                            " elements, this optimizer has " + std::to_string(total_) +
                            "; resume with the same model and optimizer");
    if (stage_ == 3) check_units(parts[k], "partition file " + std::to_string(k));
  }
}

ACCEL_DECL void ShardedOptimizer::check(torch::serialize::InputArchive& a) const {
  const auto [stage, procs, r, total] = layout_of(a);
  // Stages 1 and 2 keep the same partition of the state: either resumes the other. Stage 3's is by unit.
  const bool same_layout = stage_ == 3 ? stage == 3 : (stage == 1 || stage == 2);
  if (!same_layout || procs != processes() || r != rank() || total != total_)
    throw InvalidArgument("accel::ShardedOptimizer: mismatched partitions: the checkpoint holds rank " +
                          std::to_string(r) + "'s partition of " + std::to_string(procs) + " processes over " +
                          std::to_string(total) + " elements, this is rank " + std::to_string(rank()) + " of " +
                          std::to_string(processes()) + " over " + std::to_string(total_) +
                          "; resume with the same number of processes and the same optimizer");
  if (stage_ == 3) check_units(a, "the checkpoint");
  // The partition's state itself, as an optimizer over this rank's shards holds it once loaded (Note [An
  // optimizer's state from elsewhere]): loaded into the inner optimizer, checked, and the inner optimizer's own
  // put back.
  if (!inner_) return;
  torch::serialize::InputArchive part;
  a.read("partition", part);
  const auto what = load_and_check(*inner_, part, /*keep=*/false);
  if (!what.empty()) throw InvalidArgument("optimizer partition: " + what);
}

ACCEL_DECL at::Tensor ShardedOptimizer::unit_layout() const {
  at::Tensor t = at::empty({std::int64_t(pieces_.size()), 3}, at::TensorOptions().dtype(at::kLong));
  auto v = t.accessor<std::int64_t, 2>();
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    v[std::int64_t(i)][0] = pieces_[i].param.numel();
    v[std::int64_t(i)][1] = pieces_[i].unit_total;
    v[std::int64_t(i)][2] = pieces_[i].offset;
  }
  return t;
}

ACCEL_DECL void ShardedOptimizer::check_units(torch::serialize::InputArchive& a, const std::string& what) const {
  at::Tensor saved;
  const bool has = a.try_read("zero_units", saved);
  if (has && saved.scalar_type() == at::kLong && saved.dim() == 2 && saved.layout() == at::kStrided &&
      at::equal(saved.cpu().contiguous(), unit_layout()))
    return;
  throw InvalidArgument(
      "accel::ShardedOptimizer: mismatched units: " + what +
      " holds the optimizer pieces of a model cut into other "
      "units (or other parameters) than this one, " +
      (has ? std::string("so its state would land on other elements") : std::string("and records no unit layout")) +
      "; resume with the same model and the same Options::sharding (units, min_num_params, unit_if)");
}

ACCEL_DECL std::array<std::int64_t, 4> ShardedOptimizer::layout_of(torch::serialize::InputArchive& a) {
  auto read = [&](const char* key) {
    c10::IValue v;
    if (!a.try_read(key, v))
      throw InvalidArgument(
          std::string("accel::ShardedOptimizer: the checkpoint's optimizer state is not a ZeRO partition "
                      "(no '") +
          key +
          "'); it was saved without accel::shard::optimizer or shard::gradients: "
          "resume with the configuration that saved it");
    return v.toInt();
  };
  return {read("zero_stage"), read("zero_processes"), read("zero_rank"), read("zero_total")};
}

ACCEL_DECL bool ShardedOptimizer::unstepped(const torch::optim::Optimizer& o) {
  for (const auto& [key, st] : o.state()) {
    (void)key;
    const auto* a = dynamic_cast<const torch::optim::AdagradParamState*>(st.get());
    if (!a || a->step() != 0) return false;
  }
  return true;
}

}  // namespace accel
