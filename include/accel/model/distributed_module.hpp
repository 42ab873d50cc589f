#pragma once
//! \file
//! `DistributedModule`: the user's `torch::nn::Module` with gradients averaged across processes (what PyTorch's
//! DistributedDataParallel does, whose reducer LibTorch does not expose).
//!
//! - At construction, rank 0's parameters and buffers are broadcast, so every process starts equal.
//! - Parameters are grouped into buckets of about `bucket_bytes` (25 MiB by default), in reverse registration
//!   order (roughly the order backward produces their gradients).
//! - Each bucket owns one flat buffer, allocated once; a parameter's gradient becomes an alias of its slice
//!   (PyTorch DDP's `gradient_as_bucket_view`), so nothing is concatenated or copied back.
//! - During backward, a hook after each parameter's gradient accumulation marks it ready (moving a freshly
//!   allocated gradient into its view: one copy, during backward); when a bucket is complete (and all buckets
//!   before it have started: every rank issues the same collectives in the same order), it is divided by N and
//!   an asynchronous all-reduce (sum) starts, overlapping the rest of backward.
//! - At the end of backward (an autograd engine callback) every bucket is waited for: the gradients, views of
//!   the buckets, then hold the average.
//! - `no_sync()` (RAII) keeps gradients local: they accumulate until a step with sync.
//! - A parameter that received no gradient in a synchronising backward is an error naming it, unless
//!   `find_unused_parameters` (then it contributes zeros, as in DDP).
//! - ZeRO stage 2 (`shard_gradients`): the buckets go to the ranks that own them instead (model/partition_reducer.hpp).
//! - Full sharding (`shard_parameters`): each process keeps 1/N of every unit's parameters and gradients, gathered
//!   and reduce-scattered unit by unit (model/unit_sharder.hpp).
//! - Buffers as DDP treats them (`broadcast_buffers`, true by default): rank 0's buffers are broadcast before a
//!   forward when the previous forward ran with gradients enabled and outside `no_sync` (and before the first),
//!   all of them in one collective (their bytes, packed); `PreparedModel`'s call operator brackets the forward.
//! - The bracket is the one door into the model (DESIGN.md, "Containers"): where it matters (buffers to broadcast),
//!   a backward through the module whose forward did not go through it (`model->forward(x)`, LibTorch's habit) is
//!   an error at its first gradient that says to call `model(x)`, never a silently different run.
//! - Parameters changed between two backwards with no step of a prepared optimizer in between (the raw optimizer
//!   stepped inside an accumulation window, where gradients are this rank's own) are found by their version
//!   counters, and so are gradients cleared inside the window (`open_window` / `close_window`); the accelerator warns.

#include <accel/comm/collectives.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/core/alias.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/model/partition_reducer.hpp>
#include <accel/model/unit_sharder.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel {

//! Accelerate's `comm_hook` (`DDPCommunicationHookType`): gradient buckets travel compressed to 16 bits —
//! PyTorch's `fp16_compress_hook` / `bf16_compress_hook`: the bucket cast to the wire type, divided by N there,
//! all-reduced, cast back. Both engines reduce both types (Gloo and NCCL); a bucket already 16-bit travels as it is.
enum class CommHook { none, fp16, bf16 };

//! DDP's settings (PyTorch's `DistributedDataParallel` arguments, Accelerate's `DistributedDataParallelKwargs`); the
//! `Accelerator` fills them from `Options`.
struct DistributedOptions {
  std::int64_t bucket_bytes = 25 * 1024 * 1024;  //!< DDP's `bucket_cap_mb`, in bytes (25 MiB)
  bool find_unused_parameters = false;           //!< DDP's: a parameter without a gradient contributes zeros
  //! DDP's `broadcast_buffers`: rank 0's buffers (BatchNorm's running statistics) are broadcast before a
  //! forward of the prepared model, when DDP does it (see `before_forward`); false keeps each rank's own.
  bool broadcast_buffers = true;
  CommHook comm_hook = CommHook::none;  //!< gradient compression (see `CommHook`)
  //! Whether the construction broadcasts rank 0's parameters; false where `shard_parameters` follows, which
  //! broadcasts each unit as it cuts it (Note [Sharding onto the device unit by unit]).
  bool broadcast_parameters = true;
};

class DistributedModule;

//! A module that talks to the other processes itself (`SyncBatchNorm`): `Accelerator::prepare` hands it the job's
//! communicator (`set_communicators`). Kept here, light, so that preparing a model needs no such module's header.
struct CollectiveModule {
  virtual ~CollectiveModule() = default;
  //! Takes the job's communicator (null: one process).
  virtual void set_communicator(comm::Communicator* c) noexcept = 0;
};
//! Hands `c` to every `CollectiveModule` in `m` (itself included); returns how many there are.
inline std::size_t set_communicators(torch::nn::Module& m, comm::Communicator* c) {
  std::size_t n = 0;
  for (const auto& sub : m.modules(/*include_self=*/true))
    if (auto* x = dynamic_cast<CollectiveModule*>(sub.get())) x->set_communicator(c), ++n;
  return n;
}

//! RAII: while it lives, the gradients of the modules it holds stay local (no all-reduce in backward); on exit
//! each module goes back to what it did before. The one no-sync mechanism: `DistributedModule::no_sync()`,
//! `Accelerator::no_sync(models...)` and `Accelerator::accumulate(models...)` on accumulation steps return it.
class SyncScope {
 public:
  SyncScope() = default;
  //! Takes over `o`'s modules (`o` then releases nothing).
  SyncScope(SyncScope&& o) noexcept
      : held_(std::exchange(o.held_, {})), on_release_(std::exchange(o.on_release_, {})) {}
  SyncScope& operator=(SyncScope&&) = delete;
  SyncScope(const SyncScope&) = delete;
  ~SyncScope();
  //! Keeps `m`'s gradients local until this scope ends (nothing for a null module).
  void hold(DistributedModule* m);
  //! Runs `f` when the scope ends (the accelerator records the end of a `no_sync` for a rank out of batches).
  void on_release(std::function<void()> f) { on_release_ = std::move(f); }

 private:
  std::vector<std::pair<DistributedModule*, bool>> held_;
  std::function<void()> on_release_;
};

//! The user's module with gradients averaged across processes: PyTorch's DistributedDataParallel (bucketed asynchronous
//! all-reduce during backward, `no_sync`, `broadcast_buffers`, comm hooks, unused parameters); see the file's comment.
//! `prepare` makes one per model; `PreparedModel` holds it.
class DistributedModule {
  struct Param {
    std::string name;
    at::Tensor tensor;
    std::size_t bucket = 0;
    std::int64_t offset = 0;  // in the bucket's buffer
    bool ready = false;
  };
  struct Bucket {
    std::vector<std::size_t> params;
    std::size_t ready = 0;
    std::int64_t numel = 0;
    at::Tensor buffer;             // the gradients, then the room for the collective check (Communicator::check_room)
    at::Tensor flat;               // the gradients' part of `buffer`: every gradient of the bucket, as views
    at::Tensor wire_buffer, wire;  // under a comm hook: the compressed bucket (and its check room) that travels
    comm::Communicator::Pending pending;
  };
  struct State {
    comm::Communicator* comm = nullptr;
    DistributedOptions opt;
    std::vector<Param> params;
    std::vector<Bucket> buckets;
    std::size_t next_launch = 0;
    std::uint64_t hook_calls = 0;  // gradients accumulated so far (whether a backward went through the module)
    bool sync = true;
    bool buffers_due = true;  // DDP's require_forward_param_sync: broadcast the buffers before the next forward
    bool entered = false;     // a forward with gradients went through the door since the last backward
    bool keep_graph = false;  // this backward keeps its graph (retain_graph): another may go through it
    // After a backward under no_sync (an open accumulation window, `open_window`; empty: none): the parameters'
    // version counters and each gradient's (-1: none).
    std::vector<std::uint32_t> versions;
    std::vector<std::int64_t> grads;
    std::vector<at::Tensor> buffers;  // the module's buffers, in registration order
    bool callback_queued = false;
    std::unique_ptr<PartitionReducer> zero;  // ZeRO stage 2: gradients reduced to their owners instead
    std::shared_ptr<UnitSharder> full;       // full sharding: parameters and gradients sharded by unit instead
    bool hooked = false;                     // the post-accumulate hooks are set
    std::mutex mu;
  };

  struct Hook final : torch::autograd::PostAccumulateGradHook {
    Hook(std::shared_ptr<State> s, std::size_t i) : state(std::move(s)), index(i) {}
    void operator()(const torch::autograd::Variable&) override { DistributedModule::ready(state, index); }
    std::shared_ptr<State> state;
    std::size_t index;
  };

 public:
  //! Wraps `module`: broadcasts rank 0's parameters and buffers, lays the gradients out in buckets and registers the
  //! hooks that all-reduce them during backward.
  DistributedModule(std::shared_ptr<torch::nn::Module> module, comm::Communicator* comm, DistributedOptions opt = {})
      : module_(std::move(module)), state_(std::make_shared<State>()) {
    auto& s = *state_;
    s.comm = comm;
    s.opt = opt;
    {
      torch::NoGradGuard no_grad;
      if (opt.broadcast_parameters)
        for (auto& p : module_->named_parameters()) {
          at::Tensor t = p.value();
          broadcast(comm, t, 0);  // every process starts from rank 0's weights
        }
      for (auto& b : module_->named_buffers()) {
        at::Tensor t = b.value();
        broadcast(comm, t, 0);
      }
    }
    for (auto& p : module_->named_parameters())
      if (p.value().requires_grad()) s.params.push_back({p.key(), p.value()});
    for (auto& b : module_->named_buffers())
      if (b.value().defined() && b.value().numel() > 0) s.buffers.push_back(b.value());
    // Buckets in reverse registration order; a bucket holds one dtype on one device.
    std::int64_t bytes = 0;
    for (std::size_t k = s.params.size(); k-- > 0;) {
      const auto& t = s.params[k].tensor;
      const std::int64_t b = t.numel() * std::int64_t(t.element_size());
      const bool other_kind = !s.buckets.empty() && !same_kind(s.params[s.buckets.back().params.front()].tensor, t);
      if (s.buckets.empty() || other_kind || bytes + b > opt.bucket_bytes) s.buckets.emplace_back(), bytes = 0;
      auto& bucket = s.buckets.back();
      s.params[k].bucket = s.buckets.size() - 1;
      s.params[k].offset = bucket.numel;
      bucket.params.push_back(k);
      bucket.numel += t.numel();
      bytes += b;
    }
    if (comm && comm->size() > 1) hook();
  }
  ~DistributedModule() {
    if (state_->hooked)
      for (auto& p : state_->params) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }
  DistributedModule(const DistributedModule&) = delete;
  DistributedModule& operator=(const DistributedModule&) = delete;

  //! The user's module (for forward, state_dict, ...).
  [[nodiscard]] torch::nn::Module& module() noexcept { return *module_; }
  //! The user's module, shared.
  [[nodiscard]] const std::shared_ptr<torch::nn::Module>& shared() const noexcept { return module_; }
  //! The number of gradient buckets (ZeRO stage 2: the reducer's).
  [[nodiscard]] std::size_t buckets() const noexcept {
    return state_->zero ? state_->zero->buckets() : state_->buckets.size();
  }
  //! Bytes of gradients one synchronising backward sends into the all-reduce (halved by a 16-bit comm hook).
  [[nodiscard]] std::int64_t gradient_bytes() const {
    if (state_->zero) return state_->zero->gradient_bytes();
    std::int64_t n = 0;
    for (const auto& b : state_->buckets) {
      if (b.params.empty()) continue;
      const auto size = std::int64_t(state_->params[b.params.front()].tensor.element_size());
      n += b.numel * (compressed(*state_, b) ? 2 : size);
    }
    return n;
  }

  //! ZeRO stage 2: from now on a synchronising backward reduces each gradient to the rank that owns its
  //! partition (`layout`, from the sharded optimizer) and releases the parameters' gradients (no bucket of
  //! every gradient is allocated). Every trainable parameter must be in `layout`.
  void shard_gradients(GradientPartition layout) {
    auto& s = *state_;
    if (!s.comm || s.comm->size() == 1) return;
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (const auto& p : s.params) params.emplace_back(p.name, p.tensor);
    const auto own = layout.own.scalar_type();
    const bool wide = own == at::kFloat || own == at::kDouble;
    const auto wire = !wide || s.opt.comm_hook == CommHook::none ? own
                      : s.opt.comm_hook == CommHook::fp16        ? at::kHalf
                                                                 : at::kBFloat16;
    s.zero = std::make_unique<PartitionReducer>(s.comm, params, std::move(layout), s.opt.bucket_bytes, wire);
    s.buckets.clear();
    for (auto& p : s.params) p.bucket = 0;
  }
  //! Whether ZeRO stage 2 is on (`shard_gradients`).
  [[nodiscard]] bool shards_gradients() const noexcept { return state_->zero != nullptr; }

  //! Full sharding (`shard::parameters`): from now on each process keeps 1/N of every unit's parameters, gathered
  //! on use and freed after, and a synchronising backward reduce-scatters each unit's gradients into this rank's
  //! gradient shard (model/unit_sharder.hpp). Every process calls it. Each unit is broadcast from rank 0 as it is
  //! cut, and its shards and gathered memory live on `device` (by default where the parameters are): the model
  //! may be on the host (Note [Sharding onto the device unit by unit]).
  void shard_parameters(ShardingOptions options, std::optional<c10::Device> device = std::nullopt) {
    auto& s = *state_;
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (const auto& p : s.params) params.emplace_back(p.name, p.tensor);
    s.full = std::make_shared<UnitSharder>(*module_, s.comm, std::move(options), params, device);
    s.full->watch();
    s.buckets.clear();
    for (auto& p : s.params) p.bucket = 0;
    if (!s.hooked) hook();  // one process too: the hooks free each unit after its backward
  }
  //! The full-sharding path (nullptr: parameters not sharded).
  [[nodiscard]] const std::shared_ptr<UnitSharder>& sharder() const noexcept { return state_->full; }
  //! A forward through the door failed: units gathered for it are freed, and a gather's own error (a peer gone)
  //! is rethrown in place of the operator's (Note [Intercepting a unit without module hooks]).
  void forward_failed() {
    if (!state_->full) return;
    state_->full->after_forward(false, /*completed=*/false);
    state_->full->rethrow_failure();
  }
  //! A backward failed: the same for the units it gathered.
  void backward_failed() {
    if (!state_->full) return;
    state_->full->abandon();
    state_->full->rethrow_failure();
  }

  //! RAII: gradients stay local while the result lives (`SyncScope`).
  [[nodiscard]] SyncScope no_sync();
  //! Whether the next backward averages gradients.
  void set_sync(bool sync) { state_->sync = sync; }
  //! Whether the next backward averages gradients.
  [[nodiscard]] bool sync() const noexcept { return state_->sync; }
  // [torch:nn/parallel/distributed.py DistributedDataParallel._pre_forward / _post_forward]
  //! Before a forward: broadcasts rank 0's buffers when DDP would (`broadcast_buffers`, the previous forward
  //! ran with gradients outside `no_sync`, or none ran yet). Returns whether it did.
  bool before_forward() {
    auto& s = *state_;
    if (s.full) s.full->before_forward();
    if (!s.buffers_due || !broadcasts_buffers()) return false;
    torch::NoGradGuard no_grad;
    s.comm->broadcast_coalesced(s.buffers, 0);  // their bytes, packed into one broadcast
    return true;
  }
  //! Whether the next forward broadcasts the buffers (`before_forward`).
  [[nodiscard]] bool broadcast_due() const noexcept { return state_->buffers_due && broadcasts_buffers(); }
  //! Whether forwards may broadcast buffers at all (the option, buffers to send, several processes).
  [[nodiscard]] bool broadcasts_buffers() const noexcept {
    const auto& s = *state_;
    return s.opt.broadcast_buffers && !s.buffers.empty() && s.comm && s.comm->size() > 1;
  }
  //! After a forward: the next one broadcasts the buffers only if this one ran with gradients outside `no_sync`.
  //! Under full sharding, rethrows the error of a prefetched all-gather that failed where no operator needed it.
  void after_forward(bool grad_enabled) {
    if (state_->full) state_->full->after_forward(grad_enabled);
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->buffers_due = grad_enabled && state_->sync;
      if (grad_enabled) state_->entered = true;
    }
    if (state_->full) state_->full->rethrow_failure();
  }
  //! After a backward under `no_sync` (inside an accumulation window): records the parameters' version counters
  //! (every in-place change moves them, an optimizer's step too) and the gradients the window's next backward adds
  //! to, for `close_window`.
  void open_window() {
    auto& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    s.versions.clear();
    s.grads.clear();
    for (const auto& p : s.params) {
      s.versions.push_back(p.tensor._version());
      s.grads.push_back(p.tensor.grad().defined() ? std::int64_t(p.tensor.grad()._version()) : -1);
    }
  }
  //! What happened inside the window `open_window` recorded, by the first parameter concerned (empty: nothing).
  struct WindowChanges {
    std::string changed_parameter;  //!< changed in place: stepped on this rank's own gradients, unless a prepared
                                    //!< optimizer's step (which steps only on synchronised ones) did it
    std::string cleared_gradient;   //!< its gradient gone or changed in place (a zero_grad inside the window)
  };
  //! Before the next backward: compares with `open_window`'s record and forgets it (nothing without one).
  [[nodiscard]] WindowChanges close_window() {
    auto& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    WindowChanges out;
    if (s.versions.size() == s.params.size() && s.grads.size() == s.params.size())
      for (std::size_t k = 0; k < s.params.size(); ++k) {
        const auto& p = s.params[k];
        if (out.changed_parameter.empty() && p.tensor._version() != s.versions[k]) out.changed_parameter = p.name;
        const auto& g = p.tensor.grad();
        const bool cleared = s.grads[k] >= 0 && (!g.defined() || std::int64_t(g._version()) != s.grads[k]);
        if (out.cleared_gradient.empty() && cleared) out.cleared_gradient = p.name;
      }
    s.versions.clear();
    s.grads.clear();
    return out;
  }
  //! Forgets `open_window`'s record (a checkpoint was loaded into the parameters and gradients).
  void forget_window() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->versions.clear();
    state_->grads.clear();
  }
  //! The trainable parameters, by name, in registration order.
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> named_parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : state_->params) out.emplace_back(p.name, p.tensor);
    return out;
  }
  //! Gradients accumulated into the parameters so far: it moves when a backward goes through the module.
  [[nodiscard]] std::uint64_t backward_count() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->hook_calls;
  }
  //! What a synchronising backward does, without one: averages the gradients the parameters hold (zeros for
  //! those without one) across processes, bucket by bucket in the same order. A rank out of batches takes part
  //! in the others' backward this way (Note [Joined steps] in gradient_state.hpp). Nothing under `no_sync`.
  void synchronize() {
    auto& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.sync || !s.comm || s.comm->size() == 1) return;
    mark_all_ready(s);
    complete(s);
  }

 private:
  void hook() {
    for (std::size_t k = 0; k < state_->params.size(); ++k)
      torch::autograd::impl::set_post_acc_grad_hooks(state_->params[k].tensor, std::make_unique<Hook>(state_, k));
    state_->hooked = true;
  }
  ACCEL_DECL static void ready(const std::shared_ptr<State>& sp, std::size_t index);
  // Starts every complete bucket, in index order only.
  static void launch_ready(State& s) {
    while (s.next_launch < s.buckets.size() &&
           s.buckets[s.next_launch].ready == s.buckets[s.next_launch].params.size()) {
      launch(s, s.buckets[s.next_launch]);
      ++s.next_launch;
    }
  }
  static bool same_kind(const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.device() == b.device();
  }
  // Makes the parameter's gradient its alias of the bucket, divided by N for the all-reduce's sum (a gradient
  // autograd allocated is moved in by one fused multiply; none gives zeros).
  static void adopt(State& s, Param& p) {
    auto& b = s.buckets[p.bucket];
    if (!b.flat.defined()) {
      b.buffer = at::zeros({b.numel + s.comm->check_room(p.tensor.scalar_type(), b.numel)},
                           p.tensor.options().requires_grad(false));
      b.flat = b.buffer.narrow(0, 0, b.numel);
    }
    const auto& g = p.tensor.grad();
    const at::Scalar share = compressed(s, b) ? 1.0 : 1.0 / double(s.comm->size());  // a hook divides on the wire
    if (g.defined() &&
        g.data_ptr() == static_cast<char*>(b.flat.data_ptr()) + p.offset * std::int64_t(b.flat.element_size())) {
      if (!compressed(s, b)) g.mul_(share);
      return;
    }
    // An alias of the bucket's storage that is not an autograd view (core/alias.hpp).
    at::Tensor view = detail::alias_of(b.flat, p.offset, p.tensor.sizes());
    if (g.defined())
      at::mul_out(view, g, share);
    else
      view.zero_();
    p.tensor.mutable_grad() = view;
  }
  static void launch(State& s, Bucket& b) {
    for (auto k : b.params) adopt(s, s.params[k]);
    if (compressed(s, b)) {  // [torch:distributed/algorithms/ddp_comm_hooks/default_hooks.py fp16_compress_hook]
      if (!b.wire_buffer.defined()) {
        const auto type = s.opt.comm_hook == CommHook::fp16 ? at::kHalf : at::kBFloat16;
        b.wire_buffer = at::empty({b.numel + s.comm->check_room(type, b.numel)}, b.flat.options().dtype(type));
        b.wire = b.wire_buffer.narrow(0, 0, b.numel);
      }
      b.wire.copy_(b.flat);
      b.wire.div_(s.comm->size());
      b.pending = s.comm->all_reduce_start(b.wire_buffer, b.numel);
      return;
    }
    b.pending = s.comm->all_reduce_start(b.buffer, b.numel);  // the sum of the shares is the average
  }
  // Whether bucket `b` travels compressed (a comm hook, and a bucket wider than the wire type).
  static bool compressed(const State& s, const Bucket& b) {
    if (s.opt.comm_hook == CommHook::none || b.params.empty()) return false;
    const auto t = s.params[b.params.front()].tensor.scalar_type();
    return t == at::kFloat || t == at::kDouble;
  }
  // Whether a forward must go through the prepared model's call operator for a backward to be right: it brackets
  // the buffers' broadcast (DDP's `broadcast_buffers`, buffers to send), whatever the number of processes.
  static bool needs_door(const State& s) noexcept { return s.opt.broadcast_buffers && !s.buffers.empty(); }
  // The end of a backward through the module: the next backward needs a forward through the door again; a
  // synchronising one completes the all-reduce.
  static void end_of_backward(State& s) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      // A backward that keeps its graph (retain_graph = true) leaves it open to another backward through the same
      // forward, which went through the door.
      s.entered = s.entered && s.keep_graph;
      s.keep_graph = false;
      if (!s.sync) {
        s.callback_queued = false;
        if (s.full) s.full->end_of_backward(false);  // units freed, their gradients kept (accumulating)
        return;
      }
    }
    finalize(s);
  }
  static void finalize(State& s) {
    std::lock_guard<std::mutex> lock(s.mu);
    std::string unused;
    for (auto& p : s.params)
      if (!p.ready) unused += (unused.empty() ? "" : ", ") + p.name;
    if (!unused.empty() && !s.opt.find_unused_parameters) {
      reset(s);
      throw InvalidArgument(
          "accel::DistributedModule: parameter(s) " + unused +
          " received no gradient in this backward; "
          "every process must use every parameter, or set DistributedOptions::find_unused_parameters");
    }
    mark_all_ready(s);  // unused parameters contribute zeros
    complete(s);
  }
  static void mark_all_ready(State& s) {
    for (auto& p : s.params)
      if (!p.ready) {
        p.ready = true;
        if (!s.zero && !s.full) ++s.buckets[p.bucket].ready;
      }
  }
  // Starts what is left and waits for every bucket: the gradients, views of the buckets, are averaged.
  static void complete(State& s) {
    try {
      if (s.zero) s.zero->complete();
      if (s.full) s.full->end_of_backward(true);
      launch_ready(s);
      for (auto& b : s.buckets) {
        s.comm->finish(b.pending);
        if (compressed(s, b)) b.flat.copy_(b.wire);  // decompress: the average, back in the gradients
      }
    } catch (...) {
      reset(s);
      throw;
    }
    reset(s);
  }
  static void reset(State& s) {
    for (auto& p : s.params) p.ready = false;
    for (auto& b : s.buckets) b.ready = 0;
    s.next_launch = 0;
    s.callback_queued = false;
    if (s.zero) s.zero->reset();
    if (s.full) s.full->abandon();
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<State> state_;
};

inline SyncScope::~SyncScope() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) it->first->set_sync(it->second);
  if (on_release_) on_release_();
}
inline void SyncScope::hold(DistributedModule* m) {
  if (!m) return;
  held_.emplace_back(m, m->sync());
  m->set_sync(false);
}
inline SyncScope DistributedModule::no_sync() {
  SyncScope scope;
  scope.hold(this);
  return scope;
}

}  // namespace accel

#if ACCEL_DEFINITIONS
#include <accel/model/impl/distributed_module.ipp>
#endif
