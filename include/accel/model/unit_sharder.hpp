#pragma once
//! \file
//! `UnitSharder`: full sharding's parameter path (`shard::parameters`: FSDP, ZeRO stage 3), what `DistributedModule`
//! runs instead of its all-reduce buckets when every process keeps only 1/N of the parameters.
//!
//! - Units (`ShardingOptions`, `plan_units`): submodules named by the user, chosen by a predicate (`unit_types<...>`)
//!   or by size (`min_num_params`, FSDP's size-based auto-wrap rule); a parameter belongs to its innermost unit, and
//!   what no unit holds to the root unit.
//! - Each unit's parameters become aliases of one flat buffer of N * P elements (P = ceil(elements / N), the tail
//!   padding), the *full* buffer; rank r keeps [r * P, (r + 1) * P) of it in its own *shard* (and, for a trainable
//!   unit, a gradient shard of P elements). The full buffer's memory exists only while the unit is gathered.
//! - Gathered on its first use in a forward or a backward, freed after (Note [Intercepting a unit without module
//!   hooks]); after a unit's backward its gradients are reduce-scattered into the gradient shards, averaged as DDP
//!   averages (each divided by N, then summed), and the full gradients released.
//! - The next unit's all-gather is started when a unit is gathered, so it runs while the unit computes (forward and
//!   backward prefetch, Note [Prefetching the next unit]; `ShardingOptions::forward_prefetch`, `backward_prefetch`).

#include <accel/comm/communicator.hpp>
#include <accel/core/alias.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/Storage.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel {

// Note [Intercepting a unit without module hooks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's FSDP gathers a unit's parameters in a forward pre-hook and frees them in a forward hook; LibTorch
// modules have no hooks, `forward` is not virtual, and a user module calls its children directly (`fc1(x)`), so no
// call can be intercepted. What every unit's forward and backward do go through is the dispatcher: each operator
// that reads a parameter receives it (or a view of it) as an input. So:
//
// - A unit's parameters share one storage (its full buffer). A freed unit keeps that storage with no memory
//   (`set_data_ptr_noswap(nullptr)`, 0 bytes): every tensor that refers to it, the parameters and the views
//   autograd saved for backward, keeps its sizes; reading it without a gather is never silent (below).
// - A thread-local RecordFunction callback (the profiler's observer, which the dispatcher runs before every
//   operator, with its inputs) looks up each input's storage in a registry of freed units; the first operator that
//   touches a freed unit gathers it (memory allocated in place, then an all-gather of the shards), so the kernel
//   that follows reads the full parameters. Autograd's saved views share the storage, so a backward that needs
//   them gathers the unit again the same way; nothing in autograd changes. The callback is registered on the
//   thread that calls the prepared model (`PreparedModel::operator()`); autograd's worker threads inherit it
//   (ThreadLocalState).
// - Gathering is armed only inside a forward through the prepared model and until the backward it enables has
//   ended, since a gather issued by one process alone would wait forever. Between steps an operator that reads a
//   freed parameter (`model->forward(x)`, a norm for a log) stops the process with a message that says to call
//   `model(x)` and to read full parameters inside `Accelerator::gather_parameters`: its kernel would read freed
//   memory, and the dispatcher swallows a callback's exception, so an error cannot be thrown there. The callback is
//   registered at `prepare` on the preparing thread (so from the start), and on each thread entering the door.
// - Freeing: in a forward, a unit is freed when another unit starts (the parameters of an operator's inputs are
//   kept), and every unit but the root at the forward's end (`reshard_after_forward`; the root stays until its
//   backward, as FSDP's root does). In a backward, a unit is freed once each of its trainable parameters'
//   gradients has been accumulated (the post-accumulate hooks `DistributedModule` already has), and its gradients
//   are reduce-scattered then, in a fixed order (units in reverse order, the root last), so every process issues
//   the same collectives in the same order whatever order backward completes them in. At the backward's end
//   (the engine callback) units not completed (unused parameters) contribute zeros and everything is freed.
// - Every collective runs inside the forward or backward the user started through the joined-step door
//   (`PreparedModel::operator()`, `Accelerator::backward`); uneven inputs are refused by configuration (a process
//   out of batches runs no forward to gather in).
// - A gather that fails (a dead peer) inside the callback cannot throw through the dispatcher (RecordFunction
//   swallows callback exceptions): the unit is left freed, so the operator fails, and the door rethrows the
//   gather's own error (`rethrow_failure`).
//
// Cost: while the callback is registered, every operator on the thread takes the dispatcher's observed path (its
// inputs boxed, one registry lookup per tensor); benchmarks/ measures a step against DDP's.

//! What `save_state` writes of a fully sharded model (`ShardingOptions::state_dict_type`, Accelerate's
//! `fsdp_state_dict_type`).
enum class StateDictType {
  //! Each process writes its own shards (`model_<i>_rank<r>.pt`), nothing gathered: a process never holds more of
  //! the model than in training (Accelerate's SHARDED_STATE_DICT). Resumes at any number of processes.
  sharded,
  //! The whole model, gathered on every process and written by the main one (`model.pt`), the file an unsharded
  //! job writes (Accelerate's FULL_STATE_DICT): needs the whole model in each process's memory while saving.
  full,
};

//! FSDP's `MixedPrecisionPolicy` (`ShardingOptions::mp_policy`): the shards, which the optimizer steps, keep the
//! model's dtype; the gathered parameters that a forward and backward compute with are cast to `param_dtype`.
struct MixedPrecisionPolicy {
  //! The dtype of the gathered (unsharded) parameters, e.g. `at::kBFloat16`: each shard is cast to it before the
  //! all-gather (half the bytes travel), and the parameters' gradients come in it. Unset: the model's dtype.
  std::optional<c10::ScalarType> param_dtype{};
  //! The dtype gradients are reduce-scattered in (e.g. `at::kFloat` for a sum that loses nothing), before they are
  //! added to the gradient shards in the model's dtype. Unset: `param_dtype`.
  std::optional<c10::ScalarType> reduce_dtype{};
  //! The dtype the prepared model's tensor output is cast to. Unset: left as the forward returns it.
  std::optional<c10::ScalarType> output_dtype{};
  //! Cast the floating-point tensors given to the prepared model (`model(x)`) to `param_dtype`.
  bool cast_forward_inputs = true;
};

// Note [Sharding onto the device unit by unit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model meant for full sharding may not fit one device whole. So `prepare` does not move it to the device first (it
// moves the buffers only); the sharder takes the units one at a time: it allocates the unit's flat memory on the
// device, copies the unit's parameters into it from wherever they are (the host), broadcasts it from rank 0 (every
// process starts from rank 0's values, as DDP's construction broadcasts them, one collective per unit instead of one
// per parameter), cuts this rank's shard, and points the parameters into the unit's memory (`set_data` where the device
// or the dtype changes: the parameter keeps its TensorImpl, hooks and gradient slot) before freeing it. The host's
// copy of a parameter goes with its last reference. On the device the peak is the shards cut so far and one whole
// unit; on the host, the model as the user built it (build it on the host, or load into it after `prepare`, through
// `load_state` or inside `gather_parameters(model, true)`). On the CPU the device is the host and the same code runs.

// Note [Prefetching the next unit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As PyTorch's FSDP2 does, the next unit's all-gather is issued before the current unit computes, so that the
// communication overlaps compute (Gloo moves it on its device thread, NCCL on accel's stream):
// - Every forward records the order in which it gathers units (first gathers only; FSDP2 records the forward's
//   order too), and so does every backward (a unit it finds gathered, the root kept since the forward, is not in
//   it). When unit u is gathered in a forward, the unit after u in the previous forward's order is *prefetched*: its
//   memory allocated and its all-gather started (`Communicator::all_gather_into_start`). In a backward, the unit
//   after u in the previous backward's order (in the first backward, the forward's order reversed), so a unit whose
//   parameters no backward reads (the first layer's weight, when the input needs no gradient) is prefetched in the
//   first backward only. The first forward only records.
// - A prefetched unit counts as gathered (its memory exists). Its all-gather is finished when an operator first
//   touches it, or, if none does (the order changed), before its memory is freed and at the forward's end; nothing
//   is freed while an engine may still write into it. One prefetch is in flight at a time.
// - Memory (the goal: at most the two largest units gathered at once, and the root): in a forward, the units before
//   u are freed before the next one is prefetched (`reshard_after_forward`); in a backward, the next unit is
//   prefetched only when no unit but the root and those of the operator is gathered (the previous unit is freed once
//   its gradients are accumulated, which autograd's engine runs before any other ready node), and otherwise
//   gathered when touched, as without prefetching.
// - Every process records the same orders and issues the same collectives in the same order: the orders and every
//   decision follow from the sequence of operators alone, which is the same on every process (the gathers and the
//   reduce-scatters without prefetching rely on it already).
// - A prefetched all-gather that fails (a dead peer) is a failed gather: when an operator touches the unit it fails
//   on a unit without memory, and the door rethrows the all-gather's error (`rethrow_failure`); one that fails when
//   finished for another reason (freed unused, the forward's end) is kept and rethrown by the door after the forward
//   or at the backward's end. Its memory is never freed (the engine may still write into it; the process group
//   is unusable after a failure).

//! How `shard::parameters` cuts a model into units (`Options::sharding`): a unit's parameters are gathered
//! together and freed together. Units may nest; a parameter belongs to its innermost unit; what no unit holds
//! belongs to the root unit. Several rules add up.
struct ShardingOptions {
  //! Submodules that are units, by the names `named_modules()` gives them ("layers.3", "0" in a Sequential).
  std::vector<std::string> units{};
  //! FSDP's `size_based_auto_wrap_policy` (Accelerate's `min_num_params`): from the leaves up, a submodule whose
  //! parameters not yet in a unit number at least this becomes a unit (ModuleList and ModuleDict never do). 0: off.
  std::int64_t min_num_params = 0;
  //! A predicate on each submodule (name, module): true makes it a unit (`unit_types<...>()`: Accelerate's
  //! `transformer_layer_cls_to_wrap`).
  std::function<bool(const std::string&, const torch::nn::Module&)> unit_if{};
  //! FSDP's `reshard_after_forward`: free each unit's parameters after its forward (gathered again for backward).
  //! false keeps them from the forward to the backward (less communication, more memory).
  bool reshard_after_forward = true;
  //! What `save_state` writes of the model: each process's shards (the default), or the whole model.
  StateDictType state_dict_type = StateDictType::sharded;
  //! Mixed precision of the gathered parameters (FSDP's `MixedPrecisionPolicy`); by default none.
  MixedPrecisionPolicy mp_policy{};
  //! FSDP's `forward_prefetch` (FSDP2: `set_modules_to_forward_prefetch` on every unit; on here, off in FSDP): in a
  //! forward, when a unit is gathered, the all-gather of the unit the previous forward gathered next starts in the
  //! background (Note [Prefetching the next unit]). false: each unit is gathered by the first operator that reads
  //! it, which waits.
  bool forward_prefetch = true;
  //! FSDP's `backward_prefetch` (`BACKWARD_PRE`, FSDP2's default): the same in a backward, for the unit whose
  //! backward comes next. false: each unit is gathered when its backward first reads it, which waits.
  bool backward_prefetch = true;
};

namespace detail {
template <class T, class = void>
struct module_impl {
  using type = T;
};
template <class T>
struct module_impl<T, std::void_t<typename T::ContainedType>> {
  using type = typename T::ContainedType;
};
// A module that stands for another one where it is (accel::Checkpointed): unit_types<...> sees the module it wraps.
struct ModuleWrapper {
  virtual ~ModuleWrapper() = default;
  [[nodiscard]] virtual const torch::nn::Module& wrapped() const noexcept = 0;
};
}  // namespace detail

//! A `ShardingOptions::unit_if` that makes every submodule of one of the given types a unit (holder or module
//! types: `unit_types<torch::nn::Linear, Block>()`), as Accelerate's `transformer_layer_cls_to_wrap`; an
//! `accel::Checkpointed(block)` counts as the module it wraps.
template <class... Modules>
std::function<bool(const std::string&, const torch::nn::Module&)> unit_types() {
  static_assert(sizeof...(Modules) > 0, "accel::unit_types<...>: name at least one module type");
  return [](const std::string&, const torch::nn::Module& m) {
    const auto* w = dynamic_cast<const detail::ModuleWrapper*>(&m);
    const torch::nn::Module& inner = w ? w->wrapped() : m;  // a checkpointed Block is a Block's unit
    return (... || (dynamic_cast<const typename detail::module_impl<Modules>::type*>(&inner) != nullptr));
  };
}

//! The units `options` makes of `root`: submodule names in `named_modules()` order (the root unit is implicit).
//! A name in `options.units` that is not a submodule is an error naming it.
inline std::vector<std::string> plan_units(torch::nn::Module& root, const ShardingOptions& options) {
  const auto named = root.named_modules("", /*include_self=*/false);
  std::set<std::string> chosen;
  for (const auto& name : options.units) {
    if (!named.contains(name)) {
      std::string some;
      std::size_t k = 0;
      for (const auto& item : named) {
        if (k++ == 8) {
          some += ", ...";
          break;
        }
        some += (some.empty() ? "'" : ", '") + item.key() + "'";
      }
      throw InvalidArgument("accel::ShardingOptions::units: '" + name +
                            "' is not a submodule of the model; name units as named_modules() names them (" +
                            (some.empty() ? std::string("the model has no submodule") : some) + ")");
    }
    chosen.insert(name);
  }
  if (options.unit_if)
    for (const auto& item : named)
      if (options.unit_if(item.key(), *item.value())) chosen.insert(item.key());
  if (options.min_num_params > 0) {
    // [torch:distributed/fsdp/wrap.py _recursive_wrap, size_based_auto_wrap_policy]: children first; a module is
    // wrapped when the elements of its subtree not yet wrapped reach the threshold.
    std::function<std::int64_t(torch::nn::Module&, const std::string&)> wrap = [&](torch::nn::Module& m,
                                                                                   const std::string& name) {
      std::int64_t left = 0;
      for (const auto& c : m.named_children()) left += wrap(*c.value(), name.empty() ? c.key() : name + "." + c.key());
      for (const auto& p : m.named_parameters(/*recurse=*/false)) left += p.value().numel();
      if (name.empty()) return left;  // the root is always a unit
      if (chosen.count(name)) return std::int64_t(0);
      const bool excluded =
          dynamic_cast<torch::nn::ModuleListImpl*>(&m) || dynamic_cast<torch::nn::ModuleDictImpl*>(&m);
      if (!excluded && left >= options.min_num_params) {
        chosen.insert(name);
        return std::int64_t(0);
      }
      return left;
    };
    (void)wrap(root, "");
  }
  std::vector<std::string> out;
  for (const auto& item : named)
    if (chosen.count(item.key())) out.push_back(item.key());
  return out;
}

//! Full sharding's parameter path for one prepared model (see this file's description and Note [Intercepting a unit
//! without module hooks]); `DistributedModule::shard_parameters` makes it, `DistributedModule::sharder` returns it.
class UnitSharder : public std::enable_shared_from_this<UnitSharder> {
 public:
  //! One parameter of a unit, and where it lies in the unit's full buffer.
  struct Param {
    std::string name;         //!< its name in the model (`named_parameters()`)
    at::Tensor tensor;        //!< the parameter (an alias of the unit's full buffer)
    std::int64_t offset = 0;  //!< its first element in the unit's full buffer
    std::int64_t numel = 0;   //!< its elements
    int trainable = -1;       //!< its index among DistributedModule's trainable parameters (-1: frozen)
  };
  //! A unit: its parameters, this rank's shards, and where it is in a step.
  struct Unit {
    std::string name;            //!< its module's name in the model ("" for the root unit)
    std::vector<Param> params;   //!< its own parameters (not those of units inside it), in registration order
    std::int64_t total = 0;      //!< elements of its parameters
    std::int64_t part = 0;       //!< P: elements per rank, ceil(total / N)
    at::Tensor full;             //!< N * P elements; its storage is the parameters' (no memory while freed)
    at::Tensor exact;            //!< under `mp_policy`: N * P elements in the shards' dtype while `gather_all` holds it
    at::Tensor shard;            //!< this rank's P elements of the parameters
    at::Tensor grad;             //!< this rank's P elements of the averaged gradients (trainable units)
    std::size_t trainables = 0;  //!< its trainable parameters
    std::size_t ready = 0;       //!< those whose gradient this backward has accumulated
    bool gathered = false;       //!< its full parameters are in memory
    bool complete = false;       //!< this backward is done with it
    //! Its parameters require gradients (all of them, or none: a unit does not mix them).
    [[nodiscard]] bool trainable() const noexcept { return trainables > 0; }
  };
  //! A parameter's piece on this rank: elements [at, at + numel) of the parameter (flattened), as a tensor that
  //! aliases the unit's shard and one that aliases its gradient shard (undefined `shard`: none on this rank).
  struct Piece {
    at::Tensor shard;             //!< the piece of the parameter (an alias of the unit's shard)
    at::Tensor grad;              //!< the piece of its averaged gradient (an alias of the unit's gradient shard)
    std::int64_t at = 0;          //!< its first element in the parameter
    std::int64_t numel = 0;       //!< its elements
    std::int64_t unit_total = 0;  //!< elements of the parameter's unit (what another number of processes cuts)
    std::int64_t offset = 0;      //!< the parameter's first element in its unit
  };

  //! Cuts `root` into the units `options` names and shards every parameter across `comm`'s processes. `trainable`:
  //! `DistributedModule`'s trainable parameters, in its order (their gradients' hooks report by that index).
  //! Every process starts from rank 0's values: each unit is broadcast from rank 0 as it is cut (one collective per
  //! unit). `device`: where the shards and the gathered units live (`Accelerator::device()`; by default where the
  //! parameters are). The model may be anywhere else (on the host): each unit is copied there, broadcast and cut in
  //! turn, and its parameters then point into the unit's memory there, so the device never holds more than the shards
  //! cut so far and one whole unit (Note [Sharding onto the device unit by unit]).
  ACCEL_DECL UnitSharder(torch::nn::Module& root, comm::Communicator* comm, ShardingOptions options,
                         const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                         std::optional<c10::Device> device = std::nullopt);
  ~UnitSharder() {
    unwatch();
    settle_prefetch();
  }
  UnitSharder(const UnitSharder&) = delete;
  UnitSharder& operator=(const UnitSharder&) = delete;

  //! Registers the storages with the operator callback (once, after construction: it needs `shared_from_this`).
  ACCEL_DECL void watch();
  //! Takes them out of it (the destructor).
  ACCEL_DECL void unwatch() noexcept;
  //! The prepared model's forward starts: gathering is armed; the callback is registered on this thread.
  ACCEL_DECL void before_forward();
  //! It ended: units freed as `reshard_after_forward` says; armed until the backward it enables ends (`grad`).
  //! `completed`: it returned (its order of units is the one the next forward prefetches by), not failed.
  void after_forward(bool grad, bool completed = true) {
    std::lock_guard<std::mutex> lock(mu_);
    in_forward_ = false;
    if (completed && !recording_.empty()) forward_order_ = recording_;
    recording_.clear();
    if (grad) backward_due_ = true;
    settle_prefetch();
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const bool keep = backward_due_ && (u == 0 || !options_.reshard_after_forward);
      if (!keep) free(units_[u]);
    }
  }
  //! Trainable parameter `k`'s gradient is accumulated: its unit, once complete, is freed and (`sync`) its
  //! gradients reduce-scattered in their turn.
  void ready(std::size_t k, bool sync) {
    std::lock_guard<std::mutex> lock(mu_);
    rearmed_ = false;  // a gradient accumulated: the prepared model's end of backward ends this one
    auto& unit = units_[unit_of_trainable_[k]];
    if (unit.complete || ++unit.ready < unit.trainables) return;
    unit.complete = true;
    free(unit);
    if (sync) reduce_ready();
  }
  //! The end of a backward (`sync`: a synchronising one): units not completed contribute what their parameters
  //! hold (zeros for a missing gradient), every reduce-scatter not issued is, and every unit is freed. Throws the
  //! error of a prefetched all-gather that failed in it without an operator to fail (Note [Prefetching ...]).
  void end_of_backward(bool sync) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& u : units_)
      if (u.trainable()) u.complete = true;
    if (sync) reduce_ready();
    if (!recording_.empty()) backward_order_ = recording_;
    reset();
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }
  //! Forgets a backward that failed half-way (or one that ended: `end_of_backward`).
  void abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    reset();
  }

 private:
  void reset() {
    for (auto& u : units_) {
      u.ready = 0, u.complete = false;
      free(u);
    }
    next_reduce_ = 0;
    backward_due_ = false, rearmed_ = false;
    recording_.clear();
  }

 public:
  //! Collective: each unit's whole parameters in turn (`whole`: N * P elements in the shards' dtype, the unit's
  //! parameters at their offsets), gathered into a buffer that lives only for `fn`'s call, so at most one unit's
  //! whole parameters exist at once beyond what training holds (`Accelerator::get_state_dict`).
  ACCEL_DECL void for_each_unit_whole(const std::function<void(const Unit&, const at::Tensor& whole)>& fn);
  //! Collective: gathers every unit (for reading or writing the whole model: a checkpoint, `unwrap_model`).
  ACCEL_DECL void gather_all();
  //! Frees every unit gathered; `write_back`: first copies each unit's part of this rank back into its shard (the
  //! full parameters were written: a checkpoint loaded into them), taking a parameter's values from wherever it
  //! points now (loading may have replaced its memory) and making it an alias of its unit's buffer again.
  ACCEL_DECL void release_all(bool write_back);

  // ---- a sharded checkpoint (StateDictType::sharded; Checkpointer's `model_<i>_rank<r>.pt`) ------------------

  //! Writes this rank's shard of every unit (`fsdp_unit_<u>`), the layout they were cut from (the number of
  //! processes, this rank, each unit's and parameter's name, size and place: `fsdp_*`) and the model's buffers
  //! (`buffer.<name>`, which every process holds whole). Nothing is gathered.
  ACCEL_DECL void save_shards(torch::serialize::OutputArchive& a) const;
  //! Refuses, with an `InvalidArgument` that says what differs and the fix, an archive that is not rank `rank`'s
  //! shards of this model cut into these units among `processes` processes (or whose tensors do not fit); reads
  //! nothing into the model. `processes` is this job's when resuming at the same size.
  ACCEL_DECL void check_shards(torch::serialize::InputArchive& a, std::int64_t processes, std::int64_t rank) const;
  //! Restores this rank's shards and the buffers from an archive `check_shards` accepted (this job's size).
  ACCEL_DECL void load_shards(torch::serialize::InputArchive& a);
  //! Cuts this rank's shards out of the saved ranks' (each unit's elements [r * P, (r + 1) * P) for this P), and
  //! takes the buffers from rank 0's archive.
  ACCEL_DECL void load_resharded(std::vector<torch::serialize::InputArchive>& parts);

  //! Rethrows the error of a gather that failed inside an operator (Note [Intercepting a unit ...]); nothing else.
  void rethrow_failure() {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      e = std::exchange(failure_, nullptr);
    }
    if (e) std::rethrow_exception(e);
  }

  //! This rank's piece of a parameter (by its TensorImpl), or nullptr if the parameter is not in this model.
  [[nodiscard]] const Piece* piece_of(const at::Tensor& param) const {
    const auto it = pieces_.find(param.unsafeGetTensorImpl());
    return it == pieces_.end() ? nullptr : &it->second;
  }
  //! The units: [0] is the root unit, then the units in `named_modules()` order.
  [[nodiscard]] const std::vector<Unit>& units() const noexcept { return units_; }
  //! The options the units were cut by.
  [[nodiscard]] const ShardingOptions& options() const noexcept { return options_; }
  //! The dtype the prepared model's floating-point inputs are cast to (`mp_policy`), if any.
  [[nodiscard]] std::optional<c10::ScalarType> input_dtype() const noexcept {
    return options_.mp_policy.cast_forward_inputs ? options_.mp_policy.param_dtype : std::nullopt;
  }
  //! Bytes of full parameters gathered now, and the most at once since `reset_peak`.
  [[nodiscard]] std::int64_t gathered_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return gathered_bytes_;
  }
  //! The most bytes of full parameters gathered at once since `reset_peak` (or construction).
  [[nodiscard]] std::int64_t peak_gathered_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_bytes_;
  }
  //! The units (indices into `units()`) in the order the last forward gathered them first (empty before a forward):
  //! the order the next forward prefetches by (Note [Prefetching the next unit]).
  [[nodiscard]] std::vector<std::size_t> forward_order() const {
    std::lock_guard<std::mutex> lock(mu_);
    return forward_order_;
  }
  //! The same for the last backward (units it gathered, not those it found gathered).
  [[nodiscard]] std::vector<std::size_t> backward_order() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backward_order_;
  }
  //! Units prefetched so far (their all-gathers started ahead of their use).
  [[nodiscard]] std::int64_t prefetches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return prefetches_;
  }
  //! Prefetched units that an operator then touched (the others were freed unused).
  [[nodiscard]] std::int64_t prefetches_used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return prefetches_used_;
  }
  //! Starts a new peak from what is gathered now.
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_bytes_ = gathered_bytes_;
  }
  //! Bytes this rank keeps: its parameter shards and gradient shards.
  [[nodiscard]] std::int64_t shard_bytes() const {
    std::int64_t n = 0;
    for (const auto& u : units_)
      if (u.shard.defined()) n += std::int64_t(u.shard.nbytes() + (u.grad.defined() ? u.grad.nbytes() : 0));
    return n;
  }

  //! The operator callback (Note [Intercepting a unit ...]): units of `this` touched by one operator's inputs.
  ACCEL_DECL void touch(const std::vector<std::size_t>& units);

 private:
  [[nodiscard]] int processes() const noexcept { return comm_ ? comm_->size() : 1; }
  [[nodiscard]] int rank() const noexcept { return comm_ ? comm_->rank() : 0; }
  [[nodiscard]] std::int64_t full_bytes(const Unit& u) const { return u.part * processes() * u.full.element_size(); }
  // Whether `p` no longer aliases its slice of the unit's buffer (given other memory: set_, set_data).
  static bool moved(const Unit& u, const Param& p) { return moved_from(u.full, p); }
  static bool moved_from(const at::Tensor& buffer, const Param& p) {
    const at::Tensor& t = p.tensor;
    return t.storage().unsafeGetStorageImpl() != buffer.storage().unsafeGetStorageImpl() ||
           t.storage_offset() != buffer.storage_offset() + p.offset || !t.is_contiguous() ||
           t.scalar_type() != buffer.scalar_type();
  }
  // Takes a moved parameter's values (the whole parameter, on every process) into this rank's shard (and the
  // unit's buffer, if gathered), and makes it an alias of its slice again.
  ACCEL_DECL void adopt_moved(Unit& u, Param& p);
  // Makes `p` an alias of its slice of `buffer` (the unit's full buffer, or its `exact` one), in that buffer's dtype.
  ACCEL_DECL static void bind(const at::Tensor& buffer, Param& p);
  // Fills the unit's gathered buffer (`full`, or `exact`) from every rank's shard (collective).
  ACCEL_DECL void all_gather(Unit& u, at::Tensor& into);
  [[nodiscard]] std::size_t index_of(const Unit& u) const noexcept { return std::size_t(&u - units_.data()); }
  // Gives `u` its memory (not yet its values).
  ACCEL_DECL void allocate(Unit& u);
  // Gathers `u` (the all-gather in flight finished, if it is `u`'s).
  ACCEL_DECL void gather(Unit& u);
  // Frees `u` (the all-gather in flight finished first, if it is `u`'s).
  ACCEL_DECL void free(Unit& u);
  // The unit to prefetch once `touched` are gathered (Note [Prefetching the next unit]); npos: none.
  [[nodiscard]] ACCEL_DECL std::size_t prefetch_target(const std::vector<std::size_t>& touched) const;
  // Allocates unit `v` and starts its all-gather.
  ACCEL_DECL void prefetch(std::size_t v);
  // Waits for the all-gather in flight; if it fails, its unit is left without memory (`orphan`) and it throws.
  ACCEL_DECL void finish_prefetch();
  // The same, keeping a failure for the door instead of throwing (after an earlier failure: without waiting).
  ACCEL_DECL void settle_prefetch() noexcept;
  // Takes `u`'s memory away without freeing it (an engine that failed may still write into it).
  ACCEL_DECL void orphan(Unit& u) noexcept;
  // After a failed prefetch: what it was sending (`prefetch_part_`) is left alive too, for the same reason.
  ACCEL_DECL void keep_sent() noexcept;
  // Keeps the first failure for `rethrow_failure`.
  void keep_failure(std::exception_ptr e) noexcept {
    if (!failure_) failure_ = std::move(e);
  }
  // Reduce-scatters complete units in the fixed order (reverse unit order, the root last), stopping at the first
  // one not complete: every process issues them in the same order.
  ACCEL_DECL void reduce_ready();
  ACCEL_DECL void reduce(Unit& u);
  // The unit layout a sharded checkpoint records: per parameter (unit, elements, offset in its unit), and the units'
  // and parameters' names, one per line.
  ACCEL_DECL at::Tensor layout() const;
  ACCEL_DECL std::string layout_names() const;
  // Reads the buffers of `a` into the model; regathers every unit gathered now (its shard changed).
  ACCEL_DECL void load_buffers(torch::serialize::InputArchive& a);
  ACCEL_DECL void regather();

  torch::nn::Module* root_;  // the model (its buffers go into a sharded checkpoint)
  comm::Communicator* comm_;
  ShardingOptions options_;
  std::vector<Unit> units_;                        // [0] is the root unit, then the units in named_modules() order
  std::vector<std::size_t> unit_of_trainable_;     // per trainable index
  std::unordered_map<const void*, Piece> pieces_;  // by the parameter's TensorImpl
  std::size_t next_reduce_ = 0;                    // in the reduce order
  bool in_forward_ = false, backward_due_ = false, gathering_all_ = false, watching_ = false;
  bool rearmed_ = false;  // a retained graph's backward armed gathering again and no gradient has accumulated yet
  std::int64_t gathered_bytes_ = 0, peak_bytes_ = 0;
  // Note [Prefetching the next unit]: the orders of the last forward and backward, the one being recorded, the unit
  // prefetched and not yet touched by an operator (npos: none) and its all-gather (empty once done).
  std::vector<std::size_t> forward_order_, backward_order_, recording_;
  static constexpr std::size_t npos = std::size_t(-1);
  std::size_t inflight_ = npos;
  comm::Communicator::Pending pending_;
  at::Tensor prefetch_part_;  // what the prefetch in flight sends: the shard, or its copy in param_dtype
  std::int64_t prefetches_ = 0, prefetches_used_ = 0;
  std::exception_ptr failure_;
  mutable std::mutex mu_;
};

//! RAII (`Accelerator::gather_parameters`, FSDP's `summon_full_params`): while it lives, every unit of the models
//! it holds is gathered, so their parameters read as the full model; collective (every process opens it). With
//! `write_back`, what was written into the full parameters goes back into the shards when it ends (a model
//! loaded into them); otherwise changes are dropped.
class GatheredParameters {
 public:
  //! Nothing gathered.
  GatheredParameters() = default;
  //! Gathers every unit of `sharders` (collective); `write_back` as `Accelerator::gather_parameters` says.
  GatheredParameters(std::vector<std::shared_ptr<UnitSharder>> sharders, bool write_back)
      : sharders_(std::move(sharders)), write_back_(write_back) {
    for (const auto& s : sharders_) s->gather_all();
  }
  //! Takes over `o`'s units (released at this object's end).
  GatheredParameters(GatheredParameters&& o) noexcept
      : sharders_(std::exchange(o.sharders_, {})), write_back_(o.write_back_) {}
  GatheredParameters& operator=(GatheredParameters&&) = delete;
  GatheredParameters(const GatheredParameters&) = delete;
  ~GatheredParameters() {
    for (auto it = sharders_.rbegin(); it != sharders_.rend(); ++it) (*it)->release_all(write_back_);
  }
  //! From now on, what is in the full parameters goes back into the shards at the end (`write_back`).
  void write_back() noexcept { write_back_ = true; }

 private:
  std::vector<std::shared_ptr<UnitSharder>> sharders_;
  bool write_back_ = false;
};

}  // namespace accel

#if ACCEL_DEFINITIONS
#include <accel/model/impl/unit_sharder.ipp>
#endif
