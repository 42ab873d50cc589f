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
//! - Stage 3 (`shard::parameters`): the layout is the model's (model/unit_sharder.hpp: every unit sharded on its
//!   own); `build_over` takes each parameter's piece on this rank (an alias of its unit's shard, and of its gradient
//!   shard) and the inner optimizer steps those pieces. Nothing is gathered after a step: each unit is gathered
//!   when the next forward uses it.

#include <accel/comm/communicator.hpp>
#include <accel/core/alias.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/model/partition_reducer.hpp>
#include <accel/model/unit_sharder.hpp>
#include <accel/optim/shard_traits.hpp>
#include <accel/optim/state_check.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Type.h>
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
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

namespace accel {

//! ZeRO stage 1 (`shard::optimizer`, and stage 2's optimizer side): the optimizer's parameters in one flat buffer, this
//! rank's inner optimizer stepping its 1/N slice, the buffer all-gathered after each step (see the file's comment).
class ShardedOptimizer {
 public:
  //! Builds the inner optimizer over the shards' parameter groups.
  using Factory =
      std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

  //! Shards `user` (of a type with `ShardTraits`) across `comm`'s processes (nullptr: one process).
  //! `stage` 1 shards the optimizer state, 2 the gradients too.
  template <ShardableOptimizer O>
  ShardedOptimizer(std::shared_ptr<O> user, comm::Communicator* comm, int stage = 1)
      : ShardedOptimizer(
            user, comm,
            [raw = user.get()](std::vector<torch::optim::OptimizerParamGroup> groups) {
              return std::make_shared<O>(std::move(groups),
                                         static_cast<const typename ShardTraits<O>::Options&>(raw->defaults()));
            },
            stage) {
    consolidate_ = [this](int to) { consolidate_as<typename ShardTraits<O>::State>(to); };
    reshard_ = [this](std::vector<torch::serialize::InputArchive>& parts) {
      reshard_as<typename ShardTraits<O>::State>(parts);
    };
  }
  ShardedOptimizer(const ShardedOptimizer&) = delete;  // consolidate_ refers to this object
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  //! Shards `user` (stage 1, 2 or 3) over `comm`'s ranks; `make` builds the inner optimizer of the user's type.
  //! `build()` lays it out.
  ShardedOptimizer(std::shared_ptr<torch::optim::Optimizer> user, comm::Communicator* comm, Factory make, int stage = 1)
      : user_(std::move(user)), comm_(comm), make_(std::move(make)), stage_(stage) {
    detail::require(stage >= 1 && stage <= 3,
                    "accel::ShardedOptimizer: the ZeRO stage is 1, 2 or 3, not " + std::to_string(stage));
  }

  //! Lays the parameters out in the flat buffer and builds the inner optimizer (once; `Accelerator::prepare`
  //! calls it after the models are placed). Every process calls it.
  ACCEL_DECL void build();
  //! Stage 3: builds the inner optimizer over each parameter's piece on this rank (`piece_of`: the model's
  //! `UnitSharder::piece_of`; nullptr for a parameter of no fully sharded model, an error naming it). Every process
  //! calls it, once, before `build` (which then does nothing).
  ACCEL_DECL void build_over(const std::function<const UnitSharder::Piece*(const at::Tensor&)>& piece_of);

  //! One step of this rank's partition, then every rank's parameters, all-gathered. Call it where the optimizer
  //! would step (after the gradients are averaged).
  ACCEL_DECL void step();
  //! Clears the partition's gradients (stage 2; a stage 1 partition takes them afresh at each step).
  void zero_grad() {
    if (stage_ == 2 && grads_.defined()) grads_.zero_();
    if (stage_ == 3)
      for (auto& p : pieces_)
        if (p.grad.defined()) p.grad.zero_();
  }
  //! The optimizer whose parameters' gradients are the ones to unscale and check (GradScaler): the user's under
  //! stage 1 (every gradient, averaged), the partition's under stage 2.
  [[nodiscard]] torch::optim::Optimizer& gradient_holder() const { return stage_ >= 2 && inner_ ? *inner_ : *user_; }
  //! The ZeRO stage: 1, 2 or 3.
  [[nodiscard]] int stage() const noexcept { return stage_; }

  //! Stage 2: where the models' gradients go (every parameter's offset, P, this rank's partition of the gradients).
  [[nodiscard]] ACCEL_DECL GradientPartition gradient_partition() const;
  //! Stage 2: this rank's part of the gradients of those of `params` that are in this optimizer, as views of
  //! the partition; adds each such parameter to `covered`.
  [[nodiscard]] ACCEL_DECL std::vector<at::Tensor> owned_gradients(const std::vector<at::Tensor>& params,
                                                                   std::unordered_set<const void*>& covered) const;

 private:
  // Stage 1: this rank's slice of the (averaged) gradients the parameters hold, into the partition.
  ACCEL_DECL void take_gradients();

 public:
  //! Every rank's partition of the parameters into the flat buffer (after a step; after loading a checkpoint).
  void gather() {
    if (stage_ == 3) return;  // each unit is gathered by the model when used
    if (processes() > 1) {
      at::Tensor part = flat_.narrow(0, begin_, part_);
      comm_->all_gather_into(flat_, part);
    }
  }

  //! This rank's optimizer, over its partition.
  [[nodiscard]] torch::optim::Optimizer& inner() const { return *inner_; }
  //! The user's optimizer (groups and options; state only after `consolidate`).
  [[nodiscard]] torch::optim::Optimizer& user() const { return *user_; }
  //!@{
  //! Elements of the flat parameter space (without padding), of one rank's partition, and of the padding.
  [[nodiscard]] std::int64_t total_numel() const noexcept { return total_; }
  [[nodiscard]] std::int64_t partition_numel() const noexcept { return part_; }
  [[nodiscard]] std::int64_t padding_numel() const noexcept { return part_ * processes() - total_; }
  //!@}
  //! Bytes of this rank's optimizer state.
  [[nodiscard]] std::int64_t state_bytes() const { return inner_ ? optimizer_state_bytes(*inner_) : 0; }

  //! This rank's partition of the state, with the layout it belongs to (checked by `load`).
  ACCEL_DECL void save(torch::serialize::OutputArchive& a) const;
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
  ACCEL_DECL void consolidate(int to = 0);
  //! Empties the user's optimizer's state after `consolidate`.
  void release_consolidated() { user_->state().clear(); }

  //! Restores this rank's partition from the partitions a job of another number of processes saved (`parts[k]`:
  //! saved rank k's archive, every one of them): each state tensor is cut anew at this job's partition bounds.
  //! `check_resharded` first (the archives are read, nothing is checked here).
  void load_resharded(std::vector<torch::serialize::InputArchive>& parts) {
    detail::require(bool(reshard_),
                    "accel::ShardedOptimizer: resuming at another number of processes needs the optimizer's "
                    "type (construct the ShardedOptimizer from a std::shared_ptr of a type with ShardTraits)");
    reshard_(parts);
    rebind();
  }
  //! Whether `parts` are every partition of one layout of this parameter space (an error naming the first that is
  //! not); changes nothing.
  ACCEL_DECL void check_resharded(std::vector<torch::serialize::InputArchive>& parts) const;

  //! Whether `a` holds a partition of this rank and layout (an error naming both if not); changes nothing, so
  //! `load_state` checks every partition before it restores anything.
  ACCEL_DECL void check(torch::serialize::InputArchive& a) const;
  //! Makes every parameter an alias of its slice again, keeping its values (loading a model's state replaces a
  //! parameter's storage with the archive's).
  void rebind() {
    c10::AutoGradMode no_grad(false);
    for (const auto& s : slots_)
      if (!s.param.storage().is_alias_of(flat_.storage()) ||
          s.param.storage_offset() != flat_.storage_offset() + s.offset)
        bind(s);
  }

 private:
  struct Slot {
    at::Tensor param;
    std::string name;
    std::int64_t offset = 0, numel = 0;
  };
  // Stage 3: per piece (in order) its parameter's elements, its unit's elements and the parameter's offset in the unit:
  // what the pieces of any number of processes are cut from; saved with them and compared when loading.
  ACCEL_DECL at::Tensor unit_layout() const;
  // Whether `a` (described as `what`) holds pieces of the same unit layout (an error naming it if not).
  ACCEL_DECL void check_units(torch::serialize::InputArchive& a, const std::string& what) const;
  // What a saved partition says of itself: its stage, number of processes, rank and elements of the flat space.
  ACCEL_DECL static std::array<std::int64_t, 4> layout_of(torch::serialize::InputArchive& a);

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
  ACCEL_DECL static bool unstepped(const torch::optim::Optimizer& o);
  [[nodiscard]] int processes() const noexcept { return comm_ ? comm_->size() : 1; }
  [[nodiscard]] int rank() const noexcept { return comm_ ? comm_->rank() : 0; }
  // Copies the slot's parameter into its slice of the flat buffer and makes the parameter an alias of that slice.
  void bind(const Slot& s) {
    flat_.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape({-1}));
    detail::rebind_to(s.param, flat_, s.offset);
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
  struct OwnPiece {
    at::Tensor param, grad;  // the user's parameter; its piece's gradient on this rank (undefined: none here)
    at::Tensor shard;        // its piece, an inner parameter (undefined: none here)
    std::size_t group = 0;
    std::int64_t unit_total = 0, offset = 0;  // its unit's elements, and its first element in the unit
    std::int64_t at = 0, numel = 0;           // this rank's piece: elements [at, at + numel) of the parameter
  };
  // reshard_as for stage 3: each saved rank's pieces, computed for its number of processes, re-cut into this rank's.
  template <class S>
  void reshard_pieces_as(std::vector<torch::serialize::InputArchive>& parts);
  // A rebuilt state of type `S` (its step, and its tensors in state_tensors' order; undefined: absent) becomes the
  // inner optimizer's state for `tensor`.
  template <class S>
  void install_state(const at::Tensor& tensor, std::int64_t step, const std::vector<at::Tensor>& fields);
  std::vector<OwnPiece> pieces_;  // stage 3
  at::Tensor flat_, grads_;       // the parameters (N * P), this rank's partition of the gradients (P)
  int stage_ = 1;
  std::int64_t total_ = 0, part_ = 0, begin_ = 0, end_ = 0;
};

namespace detail {
template <class O>
bool shard_if(const std::shared_ptr<torch::optim::Optimizer>& user, comm::Communicator* comm, int stage,
              std::shared_ptr<ShardedOptimizer>& out) {
  if (typeid(*user) != typeid(O)) return false;  // the exact type: a subclass may step otherwise
  out = std::make_shared<ShardedOptimizer>(std::static_pointer_cast<O>(user), comm, stage);
  return true;
}
}  // namespace detail

//! ZeRO over an optimizer chosen at run time (`std::shared_ptr<torch::optim::Optimizer>`): dispatches on its
//! dynamic type among LibTorch's shardable optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, matched exactly).
//! Another type is refused naming it; an optimizer of your own with `ShardTraits` needs its static type.
inline std::shared_ptr<ShardedOptimizer> make_sharded_optimizer(std::shared_ptr<torch::optim::Optimizer> user,
                                                                comm::Communicator* comm, int stage = 1) {
  detail::require(user != nullptr, "accel::make_sharded_optimizer: the optimizer is null");
  std::shared_ptr<ShardedOptimizer> out;
  namespace o = torch::optim;
  if (detail::shard_if<o::SGD>(user, comm, stage, out) || detail::shard_if<o::Adam>(user, comm, stage, out) ||
      detail::shard_if<o::AdamW>(user, comm, stage, out) || detail::shard_if<o::RMSprop>(user, comm, stage, out) ||
      detail::shard_if<o::Adagrad>(user, comm, stage, out))
    return out;
  throw InvalidArgument(
      "accel::shard::optimizer / shard::gradients: an optimizer passed as std::shared_ptr<torch::optim::Optimizer> "
      "is sharded by its run-time type, which must be exactly one of torch::optim::SGD, Adam, AdamW, RMSprop, "
      "Adagrad; this one is " +
      c10::demangle(typeid(*user).name()) +
      " (pass it as a std::shared_ptr of its own type if it has accel::ShardTraits, or use accel::shard::none)");
}

}  // namespace accel

#include <accel/optim/sharded_state.hpp>  // reshard_as, consolidate_as

#if ACCEL_DEFINITIONS
#include <accel/optim/impl/sharded.ipp>
#endif
