#pragma once
//! \file
//! `ShardedOptimizer`: ZeRO stage 1 (`shard::optimizer`) over any LibTorch optimizer whose state is per parameter
//! and whose update is elementwise (SGD, Adam, AdamW, RMSprop, Adagrad).
//!
//! - A flat parameter space: the optimizer's parameters, group after group, in one buffer of N * P elements
//!   (P = ceil(total / N), the tail padding); every parameter becomes an alias of its slice (same tensor object,
//!   so the model, the user's optimizer and `DistributedModule` keep working on it).
//! - Rank r owns the slice [r * P, (r + 1) * P). Its *inner* optimizer, a fresh optimizer of the user's type and
//!   options, is built over one flat tensor per parameter group: the group's part of that slice (an alias of the
//!   buffer). So it allocates state for 1/N of the parameters only, and the user's optimizer never steps (no state).
//! - `step()`: copies this rank's slice of the (already averaged) gradients into the shards' gradients, takes
//!   every group's options from the user's optimizer (a scheduler changes them there), steps the inner optimizer
//!   and all-gathers the buffer: every parameter, updated, on every rank.
//! - Elementwise updates make this equal to stepping the whole optimizer on every rank.
//! - Stage 2 (`shard::gradients`): the partition's gradients are kept in one buffer of P elements
//!   (`gradient_partition()`), which the models' `PartitionReducer`s fill during backward; the parameters hold no
//!   gradient after a synchronising backward, `step()` takes the partition as it is, `zero_grad()` clears it, and
//!   clipping and the GradScaler work on it (`owned_gradients`, `gradient_holder`).

#include <accel/comm/communicator.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/model/partition_reducer.hpp>
#include <accel/optim/shard_traits.hpp>
#include <accel/optim/state_check.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace accel {

class ShardedOptimizer {
 public:
  //! Builds the inner optimizer over the shards' parameter groups.
  using Factory = std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

  //! Shards `user` (of a type with `ShardTraits`) across `comm`'s processes (nullptr: one process).
  //! `stage` 1 shards the optimizer state, 2 the gradients too.
  template <ShardableOptimizer O>
  ShardedOptimizer(std::shared_ptr<O> user, comm::Communicator* comm, int stage = 1)
      : ShardedOptimizer(user, comm, [raw = user.get()](std::vector<torch::optim::OptimizerParamGroup> groups) {
          return std::make_shared<O>(std::move(groups), static_cast<const typename ShardTraits<O>::Options&>(raw->defaults()));
        }, stage) {
    consolidate_ = [this](int to) { consolidate_as<typename ShardTraits<O>::State>(to); };
    reshard_ = [this](std::vector<torch::serialize::InputArchive>& parts) { reshard_as<typename ShardTraits<O>::State>(parts); };
  }
  ShardedOptimizer(const ShardedOptimizer&) = delete;  // consolidate_ refers to this object
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  ShardedOptimizer(std::shared_ptr<torch::optim::Optimizer> user, comm::Communicator* comm, Factory make, int stage = 1)
      : user_(std::move(user)), comm_(comm), make_(std::move(make)), stage_(stage) {
    detail::require(stage == 1 || stage == 2, "accel::ShardedOptimizer: the ZeRO stage is 1 or 2, not " + std::to_string(stage));
  }

  //! Lays the parameters out in the flat buffer and builds the inner optimizer (once; `Accelerator::prepare`
  //! calls it after the models are placed). Every process calls it.
  void build() {
    if (inner_) return;
    const int n = processes(), r = rank();
    detail::require(unstepped(*user_), "accel::ShardedOptimizer: the optimizer already has state (it stepped before "
                                            "prepare); prepare it before its first step, so that each process builds the state "
                                            "of its partition only");
    std::unordered_set<const void*> seen;
    const auto& groups = user_->param_groups();
    std::vector<std::int64_t> group_begin, group_end;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      group_begin.push_back(total_);
      for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
        const at::Tensor& p = groups[g].params()[k];
        const std::string where = "parameter " + std::to_string(k) + " of group " + std::to_string(g) + " (" + describe(p) + ")";
        detail::require(p.requires_grad(), "accel::ShardedOptimizer: " + where + " does not require a gradient; ZeRO steps a flat "
                                           "partition of every parameter: leave frozen parameters out of the optimizer");
        detail::require(seen.insert(p.unsafeGetTensorImpl()).second, "accel::ShardedOptimizer: " + where + " is listed twice");
        if (!slots_.empty())
          detail::require(p.scalar_type() == slots_.front().param.scalar_type() && p.device() == slots_.front().param.device(),
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
        s.tensor = alias(flat_, s.begin, s.end - s.begin);
        s.tensor.mutable_grad() = alias(grads_, s.begin - begin_, s.end - s.begin);
        params.push_back(s.tensor);
      }
      shards_.push_back(s);
      mine.emplace_back(std::move(params), groups[g].options().clone());
    }
    inner_ = make_(std::move(mine));
  }

  //! One step of this rank's partition, then every rank's parameters, all-gathered. Call it where the optimizer
  //! would step (after the gradients are averaged).
  void step() {
    detail::require(inner_ != nullptr, "accel::ShardedOptimizer: step() before build()");
    c10::AutoGradMode no_grad(false);
    if (stage_ == 1) take_gradients();
    auto& theirs = user_->param_groups();
    auto& ours = inner_->param_groups();
    for (std::size_t g = 0; g < ours.size(); ++g) ours[g].set_options(theirs[g].options().clone());
    inner_->step();
    gather();
  }
  //! Clears the partition's gradients (stage 2; a stage 1 partition takes them afresh at each step).
  void zero_grad() {
    if (stage_ == 2 && grads_.defined()) grads_.zero_();
  }
  //! The optimizer whose parameters' gradients are the ones to unscale and check (GradScaler): the user's under
  //! stage 1 (every gradient, averaged), the partition's under stage 2.
  [[nodiscard]] torch::optim::Optimizer& gradient_holder() const { return stage_ == 2 && inner_ ? *inner_ : *user_; }
  [[nodiscard]] int stage() const noexcept { return stage_; }

  //! Stage 2: where the models' gradients go (every parameter's offset, P, this rank's partition of the gradients).
  [[nodiscard]] GradientPartition gradient_partition() const {
    detail::require(inner_ != nullptr, "accel::ShardedOptimizer: gradient_partition() before build()");
    GradientPartition g;
    for (const auto& s : slots_) g.offsets.emplace(s.param.unsafeGetTensorImpl(), s.offset);
    g.partition = part_;
    g.own = grads_;
    return g;
  }
  //! Stage 2: this rank's part of the gradients of those of `params` that are in this optimizer, as views of
  //! the partition; adds each such parameter to `covered`.
  [[nodiscard]] std::vector<at::Tensor> owned_gradients(const std::vector<at::Tensor>& params,
                                                        std::unordered_set<const void*>& covered) const {
    std::unordered_set<const void*> wanted;
    for (const auto& p : params) wanted.insert(p.unsafeGetTensorImpl());
    std::vector<at::Tensor> out;
    for (const auto& s : slots_) {
      if (!wanted.count(s.param.unsafeGetTensorImpl())) continue;
      covered.insert(s.param.unsafeGetTensorImpl());
      const std::int64_t lo = std::max(s.offset, begin_), hi = std::min(s.offset + s.numel, end_);
      if (lo < hi) out.push_back(grads_.narrow(0, lo - begin_, hi - lo));
    }
    return out;
  }

 private:
  // Stage 1: this rank's slice of the (averaged) gradients the parameters hold, into the partition.
  void take_gradients() {
    for (const auto& s : slots_)
      if (!s.param.grad().defined())
        throw InvalidArgument("accel::ShardedOptimizer: " + s.name + " has no gradient at this step; ZeRO steps every "
                              "parameter's partition: use every parameter in the loss (or set Options::find_unused_parameters, "
                              "which gives unused ones zero gradients), or leave it out of the optimizer");
    for (const auto& s : slots_) {
      const std::int64_t lo = std::max(s.offset, begin_), hi = std::min(s.offset + s.numel, end_);
      if (lo >= hi) continue;
      grads_.narrow(0, lo - begin_, hi - lo).copy_(s.param.grad().reshape({-1}).narrow(0, lo - s.offset, hi - lo));
    }
  }

 public:

  //! Every rank's partition of the parameters into the flat buffer (after a step; after loading a checkpoint).
  void gather() {
    if (processes() > 1) {
      at::Tensor part = flat_.narrow(0, begin_, part_);
      comm_->all_gather_into(flat_, part);
    }
  }

  [[nodiscard]] torch::optim::Optimizer& inner() const { return *inner_; }
  [[nodiscard]] torch::optim::Optimizer& user() const { return *user_; }
  //! Elements of the flat parameter space (without padding), of one rank's partition, and of the padding.
  [[nodiscard]] std::int64_t total_numel() const noexcept { return total_; }
  [[nodiscard]] std::int64_t partition_numel() const noexcept { return part_; }
  [[nodiscard]] std::int64_t padding_numel() const noexcept { return part_ * processes() - total_; }
  //! Bytes of this rank's optimizer state.
  [[nodiscard]] std::int64_t state_bytes() const { return inner_ ? optimizer_state_bytes(*inner_) : 0; }

  //! This rank's partition of the state, with the layout it belongs to (checked by `load`).
  void save(torch::serialize::OutputArchive& a) const {
    a.write("zero_stage", c10::IValue(std::int64_t(stage_)));
    a.write("zero_processes", c10::IValue(std::int64_t(processes())));
    a.write("zero_rank", c10::IValue(std::int64_t(rank())));
    a.write("zero_total", c10::IValue(total_));
    torch::serialize::OutputArchive inner(a.compilation_unit());
    inner_->save(inner);
    a.write("partition", inner);
  }
  //! Restores a partition `save` wrote for the same rank of the same layout; anything else is an error.
  void load(torch::serialize::InputArchive& a) {
    check(a);
    torch::serialize::InputArchive inner;
    a.read("partition", inner);
    inner_->load(inner);
    rebind();
  }
  //! Collective: every rank's partition of the state, assembled on rank `to` into the user's optimizer, as an
  //! unsharded optimizer holds it (so `torch::save(user(), path)` there writes what an unsharded job loads with
  //! `torch::load`); the other ranks' user optimizers stay empty. One reduce per group and state tensor, each the
  //! size of the group. `release_consolidated()` empties the user's optimizer again (steps never read it).
  void consolidate(int to = 0) {
    detail::require(inner_ != nullptr, "accel::ShardedOptimizer: consolidate() before build()");
    detail::require(bool(consolidate_), "accel::ShardedOptimizer: consolidate() needs the optimizer's type (construct the "
                                        "ShardedOptimizer from a std::shared_ptr of one of the types with ShardTraits)");
    detail::require(to >= 0 && to < processes(), "accel::ShardedOptimizer: consolidate(" + std::to_string(to) + "): no such rank among " +
                                                     std::to_string(processes()));
    consolidate_(to);
  }
  void release_consolidated() { user_->state().clear(); }

  //! Restores this rank's partition from the partitions a job of another number of processes saved (`parts[k]`:
  //! saved rank k's archive, every one of them): each state tensor is cut anew at this job's partition bounds.
  //! `check_resharded` first (the archives are read, nothing is checked here).
  void load_resharded(std::vector<torch::serialize::InputArchive>& parts) {
    detail::require(bool(reshard_), "accel::ShardedOptimizer: resuming at another number of processes needs the optimizer's "
                                    "type (construct the ShardedOptimizer from a std::shared_ptr of a type with ShardTraits)");
    reshard_(parts);
    rebind();
  }
  //! Whether `parts` are every partition of one layout of this parameter space (an error naming the first that is
  //! not); changes nothing.
  void check_resharded(std::vector<torch::serialize::InputArchive>& parts) const {
    detail::require(bool(reshard_), "accel::ShardedOptimizer: resuming at another number of processes needs the optimizer's "
                                    "type (construct the ShardedOptimizer from a std::shared_ptr of a type with ShardTraits)");
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const auto [stage, procs, r, total] = layout_of(parts[k]);
      if ((stage != 1 && stage != 2) || procs != std::int64_t(parts.size()) || r != std::int64_t(k) || total != total_)
        throw InvalidArgument("accel::ShardedOptimizer: mismatched partitions: partition file " + std::to_string(k) + " of " +
                              std::to_string(parts.size()) + " holds rank " + std::to_string(r) + "'s partition of " + std::to_string(procs) +
                              " processes over " + std::to_string(total) + " elements, this optimizer has " + std::to_string(total_) +
                              "; resume with the same model and optimizer");
    }
  }

  //! Whether `a` holds a partition of this rank and layout (an error naming both if not); changes nothing, so
  //! `load_state` checks every partition before it restores anything.
  void check(torch::serialize::InputArchive& a) const {
    const auto [stage, procs, r, total] = layout_of(a);
    // Stages 1 and 2 keep the same partition of the state: either resumes the other.
    if ((stage != 1 && stage != 2) || procs != processes() || r != rank() || total != total_)
      throw InvalidArgument("accel::ShardedOptimizer: mismatched partitions: the checkpoint holds rank " + std::to_string(r) + "'s partition of " +
                            std::to_string(procs) + " processes over " + std::to_string(total) + " elements, this is rank " +
                            std::to_string(rank()) + " of " + std::to_string(processes()) + " over " + std::to_string(total_) +
                            "; resume with the same number of processes and the same optimizer");
    // The partition's state itself, as an optimizer over this rank's shards holds it once loaded (Note [An
    // optimizer's state from elsewhere]): loaded into the inner optimizer, checked, and the inner optimizer's own put back.
    if (!inner_) return;
    torch::serialize::InputArchive part;
    a.read("partition", part);
    const auto what = load_and_check(*inner_, part, /*keep=*/false);
    if (!what.empty()) throw InvalidArgument("optimizer partition: " + what);
  }
  //! Makes every parameter an alias of its slice again, keeping its values (loading a model's state replaces a
  //! parameter's storage with the archive's).
  void rebind() {
    c10::AutoGradMode no_grad(false);
    for (const auto& s : slots_)
      if (!s.param.storage().is_alias_of(flat_.storage()) || s.param.storage_offset() != flat_.storage_offset() + s.offset) bind(s);
  }

 private:
  struct Slot {
    at::Tensor param;
    std::string name;
    std::int64_t offset = 0, numel = 0;
  };
  // What a saved partition says of itself: its stage, number of processes, rank and elements of the flat space.
  static std::array<std::int64_t, 4> layout_of(torch::serialize::InputArchive& a) {
    auto read = [&](const char* key) {
      c10::IValue v;
      if (!a.try_read(key, v))
        throw InvalidArgument(std::string("accel::ShardedOptimizer: the checkpoint's optimizer state is not a ZeRO partition "
                                          "(no '") + key + "'); it was saved without accel::shard::optimizer or shard::gradients: "
                                          "resume with the configuration that saved it");
      return v.toInt();
    };
    return {read("zero_stage"), read("zero_processes"), read("zero_rank"), read("zero_total")};
  }

  struct Shard {
    at::Tensor tensor;  // this rank's part of the group, an alias of the flat buffer (undefined: none)
    std::int64_t begin = 0, end = 0;
    std::int64_t group_begin = 0, group_end = 0;  // the whole group's range of the flat space
  };

  // load_resharded() for the state type `S`: each saved rank's partition is loaded into an optimizer of the user's
  // type over that rank's shards (as it was saved), and the part of every state tensor that falls in this rank's
  // new shard is copied there; the step count is the saved one.
  template <class S>
  void reshard_as(std::vector<torch::serialize::InputArchive>& parts);
  // consolidate() for the state type `S` of the optimizer: which state tensors exist and the step count, agreed
  // (max) across ranks per group; each existing tensor reduced whole to `to` (every rank contributes its part,
  // zeros elsewhere); there, each parameter's slice becomes its state.
  template <class S>
  void consolidate_as(int to);

  // Whether `o` has never stepped: no state, or only the state Adagrad's constructor makes (step 0).
  static bool unstepped(const torch::optim::Optimizer& o) {
    for (const auto& [key, st] : o.state()) {
      (void)key;
      const auto* a = dynamic_cast<const torch::optim::AdagradParamState*>(st.get());
      if (!a || a->step() != 0) return false;
    }
    return true;
  }
  [[nodiscard]] int processes() const noexcept { return comm_ ? comm_->size() : 1; }
  [[nodiscard]] int rank() const noexcept { return comm_ ? comm_->rank() : 0; }
  // Copies the slot's parameter into its slice of the flat buffer and makes the parameter an alias of that slice.
  void bind(const Slot& s) {
    flat_.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape({-1}));
    at::Tensor p = s.param;
    p.set_(flat_.storage(), flat_.storage_offset() + s.offset, p.sizes(), contiguous_strides(p.sizes()));
  }
  static std::vector<std::int64_t> contiguous_strides(at::IntArrayRef sizes) {
    std::vector<std::int64_t> strides(sizes.size(), 1);
    for (std::size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
    return strides;
  }
  // A 1-d alias of `flat`'s storage that is not an autograd view (an optimizer's parameter must be a leaf).
  static at::Tensor alias(const at::Tensor& flat, std::int64_t offset, std::int64_t numel) {
    at::Tensor t = at::empty({0}, flat.options());
    t.set_(flat.storage(), flat.storage_offset() + offset, {numel}, {1});
    return t;
  }
  static std::string describe(const at::Tensor& p) {
    std::string shape;
    for (auto d : p.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return "shape [" + shape + "], " + std::string(c10::toString(p.scalar_type())) + " on " + p.device().str();
  }

  std::shared_ptr<torch::optim::Optimizer> user_;
  comm::Communicator* comm_ = nullptr;
  Factory make_;
  std::function<void(int)> consolidate_;  // consolidate_as<the optimizer's state type> (empty: type unknown)
  std::function<void(std::vector<torch::serialize::InputArchive>&)> reshard_;  // reshard_as<the state type>
  std::shared_ptr<torch::optim::Optimizer> inner_;
  std::vector<Slot> slots_;
  std::vector<Shard> shards_;
  at::Tensor flat_, grads_;  // the parameters (N * P), this rank's partition of the gradients (P)
  int stage_ = 1;
  std::int64_t total_ = 0, part_ = 0, begin_ = 0, end_ = 0;
};












}  // namespace accel

#include <accel/optim/sharded_state.hpp>  // reshard_as, consolidate_as
