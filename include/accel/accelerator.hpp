#pragma once
//! \file
//! `Accelerator<Policies...>`: the object a training loop talks to.
//!
//! \code
//! struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};
//!
//! Acc acc{accel::Options{.seed = 42, .gradient_accumulation_steps = 4}};
//! auto [model, opt, loader, sched] = acc.prepare(net, std::make_shared<torch::optim::AdamW>(net->parameters()),
//!                                                accel::data::DataLoader(dataset, {.batch_size = 64, .shuffle = true}),
//!                                                std::make_shared<torch::optim::StepLR>(*adamw, 100));
//! for (const auto& batch : loader) {
//!   auto step = acc.accumulate(model);                 // sync decision; no_sync on accumulation steps
//!   auto ac = acc.autocast();                           // bf16/fp16 forward under Options::mixed_precision
//!   acc.backward(loss_fn(model->forward(batch.data), batch.target));
//!   opt.step(); sched.step(); opt.zero_grad();          // real steps only when gradients are synchronised
//! }
//! acc.save_state("checkpoints/last");
//! \endcode
//!
//! Deriving a named struct (rather than a `using` alias) keeps diagnostics short: they say `Acc`.
//! A wrong configuration stops the build with exactly one of the messages of `CheckedConfig` (config.hpp); a
//! wrong argument to `prepare` with one message too. Run-time knobs that never change a type are in `Options`.

#include <accel/checkpoint/checkpointer.hpp>
#include <accel/checkpoint/custom.hpp>
#include <accel/checkpoint/project.hpp>
#include <accel/checkpoint/safetensors.hpp>
#include <accel/core/generator_state.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/config.hpp>
#include <accel/state/gradient_state.hpp>
#include <accel/data/prepare.hpp>
#include <accel/model/autocast.hpp>
#include <accel/model/prepared_model.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/state/preemption.hpp>
#include <accel/state/process_state.hpp>
#include <accel/tracking/trackers.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

namespace accel {

using checkpoint::ProjectConfiguration;

//! Accelerate's `mixed_precision`.
enum class Precision {
  no,    //!< fp32 everywhere
  fp16,  //!< fp16 autocast and a GradScaler; needs a GPU (as in Accelerate)
  bf16,  //!< bf16 autocast, on the CPU or a GPU; no scaling needed
};

//! The run-time settings of an `Accelerator`: what never changes a type.
struct Options {
  std::optional<std::uint64_t> seed;           //!< `set_seed` at construction (unset: leave the generators alone)
  bool device_specific_seed = false;           //!< add the process index to the seed
  int gradient_accumulation_steps = 1;
  bool sync_with_dataloader = true;            //!< sync (and reset the counter) at the end of every loader
  bool sync_each_batch = false;                //!< all-reduce on every batch, step every `gradient_accumulation_steps`
  bool step_scheduler_with_optimizer = true;   //!< false: the scheduler steps on every call
  bool scheduler_steps_once = false;           //!< step schedulers once per optimizer step, not once per process
  Precision mixed_precision = Precision::no;
  GradScalerOptions scaler{};                  //!< the loss scaling under `Precision::fp16`
  std::int64_t bucket_bytes = 25 * 1024 * 1024;  //!< gradient all-reduce bucket size
  bool find_unused_parameters = false;         //!< parameters without a gradient contribute zeros instead of an error
  bool broadcast_buffers = true;               //!< DDP's: rank 0's buffers before a forward, when DDP broadcasts them
  CommHook comm_hook = CommHook::none;         //!< Accelerate's comm_hook: gradient buckets compressed to fp16 or bf16
  comm::CommOptions comm{};                    //!< collective and rendezvous timeouts
  LaunchOverrides launch{};                    //!< explicit rank / world size / address, winning over the environment
  std::vector<tracking::Tracker> log_with{};   //!< Accelerate's log_with: the trackers `init_trackers` starts
  std::filesystem::path logging_dir{};         //!< trackers write into <logging_dir>/<project_name>/ (empty: the
                                               //!< project's logging_dir, else its project_dir)
  ProjectConfiguration project_config{};       //!< checkpoint folder, automatic naming, total_limit (checkpoint/project.hpp)
  PreemptionOptions preemption{};              //!< save and stop on SIGTERM / SIGUSR1 (state/preemption.hpp)
};

namespace detail {
template <class T> struct shared_of { using type = void; };
template <class T> struct shared_of<std::shared_ptr<T>> { using type = T; };
template <class T> using shared_t = typename shared_of<std::remove_cvref_t<T>>::type;

template <class T> inline constexpr bool is_data_loader = false;
template <class D, class C> inline constexpr bool is_data_loader<data::DataLoader<D, C>> = true;

//! What `prepare` makes of an argument.
enum class Prepares { model, optimizer, scheduler, loader, optimizer_lvalue, unknown };
template <class A>
consteval Prepares classify() {
  using T = std::remove_cvref_t<A>;
  if constexpr (ModuleHandle<T>) return Prepares::model;
  else if constexpr (TorchOptimizer<shared_t<T>>) return Prepares::optimizer;
  else if constexpr (TorchOptimizer<T>) return std::is_rvalue_reference_v<A&&> && !std::is_const_v<std::remove_reference_t<A>> ? Prepares::optimizer : Prepares::optimizer_lvalue;
  else if constexpr (TorchScheduler<shared_t<T>>) return Prepares::scheduler;
  else if constexpr (is_data_loader<T>) return Prepares::loader;
  else return Prepares::unknown;
}

//! A scheduler between the two passes of `prepare` (it is linked to the optimizers once all are prepared).
template <class S> struct PendingScheduler { std::shared_ptr<S> scheduler; };
struct NotPrepared {};

}  // namespace detail

template <class... Policies>
class Accelerator {
 public:
  //! The resolved configuration: `config::dist`, `config::split_batches`, `config::dispatch`, ... Naming it
  //! instantiates the checks: a wrong list of policies stops the build here with one message.
  using config = CheckedConfig<Policies...>;
  static constexpr ConfigProblem problem = config::problem;
  static constexpr bool one_process = std::is_same_v<typename config::dist, dist::none>;
  //! The engine connecting the processes (state/engine.hpp); a configuration with a problem, which has already
  //! stopped the build with its message, falls back to `dist::none` so that it is the only error.
  using engine = std::conditional_t<problem == ConfigProblem::none, typename config::dist, dist::none>;

  Accelerator(Options o = {})  // NOLINT: implicit, so that `Acc acc{accel::Options{...}}` reads well
      : opt_(o), state_(ProcessOptions{.launch = o.launch, .comm = o.comm}, engine{}),
        accumulation_({.steps = o.gradient_accumulation_steps, .sync_with_dataloader = o.sync_with_dataloader,
                       .sync_each_batch = o.sync_each_batch}) {
    checkpoint::check_project(o.project_config);
    if (o.preemption.enabled) {
      detail::require(o.project_config.automatic_checkpoint_naming,
                      "accel: Options::preemption saves with save_state() under automatic checkpoint naming; set "
                      "Options::project_config.automatic_checkpoint_naming = true (and its project_dir)");
      detail::require(o.preemption.check_every >= 1, "accel: PreemptionOptions::check_every is " + std::to_string(o.preemption.check_every) +
                                                          "; agree on signals every 1 or more optimizer steps");
      signals_ = detail::SignalWatch(o.preemption.signals);
      bind_boundary_hook();
    }
    if (o.seed) set_seed(*o.seed, state_.process_index(), o.device_specific_seed);
    if (o.mixed_precision == Precision::fp16) {
      detail::require(state_.device().is_cuda(), "accel: Precision::fp16 needs a GPU (fp16 training scales the loss on the "
                                                 "device); this process runs on the CPU: use Precision::bf16, or Precision::no");
      scaler_ = std::make_shared<GradScaler>(state_.device(), state_.comm(), o.scaler);
      checkpointer_.set_scaler({[s = scaler_](auto& a) { s->save(a); }, [s = scaler_](auto& a) { s->load(a); }});
    }
  }
  Accelerator(Accelerator&&) = default;  // the step boundary hook follows it (bind_boundary_hook)
  Accelerator& operator=(Accelerator&&) = delete;
  ~Accelerator() { GradientState::instance().clear_step_boundary_hook(this); }

  // ---- prepare ---------------------------------------------------------------------------------------------

  // [accelerate:accelerator.py Accelerator.prepare]
  //! Prepares models, optimizers, loaders and schedulers, in any number and any order; returns the prepared
  //! objects in argument order (one object: itself; several: a tuple for structured bindings).
  //!
  //! | argument                                           | result                                          |
  //! |----------------------------------------------------|-------------------------------------------------|
  //! | model: `std::shared_ptr<M>` or a module holder      | `PreparedModel<Holder>` (the holder itself under `dist::none`), moved to the device, rank 0's weights |
  //! | optimizer: `std::shared_ptr<O>` or `O&&`            | `AcceleratedOptimizer<O>`                        |
  //! | `data::DataLoader`                                  | the prepared loader of `config` (`ShardedLoader`, `DispatchedLoader`, ...) |
  //! | scheduler: `std::shared_ptr<S>` (an `LRScheduler`: LibTorch's, or optim/schedulers.hpp's PyTorch-exact ones) | `AcceleratedScheduler<S>`, held back by every prepared optimizer's skipped steps |
  //!
  //! An optimizer holding a parameter of no prepared model is an error (build it from the model's
  //! `parameters()`). The order of preparation is the order of the checkpoint's files.
  template <class... Ts>
  auto prepare(Ts&&... objects) {
    static_assert(sizeof...(Ts) > 0, "accel::Accelerator::prepare: pass at least one object");
    static_assert(((detail::classify<Ts>() != detail::Prepares::unknown) && ...),
                  "accel::Accelerator::prepare: an argument is neither a model (std::shared_ptr<torch::nn::Module> or a "
                  "module holder), an optimizer (derived from torch::optim::Optimizer), an accel::data::DataLoader nor a "
                  "scheduler (std::shared_ptr of a torch::optim::LRScheduler)");
    static_assert(((detail::classify<Ts>() != detail::Prepares::optimizer_lvalue) && ...),
                  "accel::Accelerator::prepare: an optimizer cannot be copied; pass it as std::shared_ptr (to keep a "
                  "handle, e.g. for a scheduler) or by std::move");
    bind_boundary_hook();
    const std::size_t first_new_optimizer = optimizers_.size();
    // Pass 1 (braced initialisation runs left to right): models, optimizers, loaders. Pass 2: schedulers, linked
    // to the optimizers prepared so far.
    std::tuple<decltype(first_pass(std::forward<Ts>(objects)))...> first{first_pass(std::forward<Ts>(objects))...};
    check_optimizer_parameters(first_new_optimizer);
    // ZeRO: the flat buffers are laid out once the models are placed (placement may replace a parameter's storage).
    for (std::size_t i = first_new_optimizer; i < optimizers_.size(); ++i)
      if (optimizers_[i].sharded) optimizers_[i].sharded->build();
    if constexpr (config::zero_stage == 2) shard_gradients();
    auto out = std::apply(
        [this](auto&... r) { return std::tuple<decltype(second_pass(std::move(r)))...>{second_pass(std::move(r))...}; }, first);
    if constexpr (sizeof...(Ts) == 1) return std::get<0>(std::move(out));
    else return out;
  }

  //! Prepares a loader under `loading::dispatched` with a slice function for non-tensor fields.
  template <class Dataset, class Collate, class Slice>
  auto prepare_data_loader(const data::DataLoader<Dataset, Collate>& loader, Slice slice) {
    return register_loader(data::prepare_data_loader<config>(loader, state_, std::move(slice)));
  }

  // ---- the loop ------------------------------------------------------------------------------------------

  // [accelerate:accelerator.py Accelerator.accumulate]
  //! Call once per batch, before the forward pass; keep the result alive until after `backward`. Decides
  //! whether this step synchronises gradients (every `gradient_accumulation_steps`-th step and at the end of the
  //! loader); on the others the models' gradients stay local.
  template <class... Models>
  [[nodiscard]] SyncScope accumulate(const Models&... models) {
    bind_boundary_hook();
    accumulation_.begin_step();
    SyncScope scope;
    if (!accumulation_.allow_sync()) (scope.hold(distributed_of(models).get()), ...);
    if (GradientState::instance().recording()) record_accumulate({distributed_of(models)...});
    return scope;
  }
  //! Gradients of `models` stay local while the result lives (Accelerate's `no_sync`).
  template <class... Models>
  [[nodiscard]] SyncScope no_sync(const Models&... models) {
    return no_sync_of({distributed_of(models)...});
  }

  // [accelerate:accelerator.py Accelerator.backward]
  //! `loss / gradient_accumulation_steps` (always, as in Accelerate), scaled under fp16, then backward.
  void backward(const at::Tensor& loss) {
    auto& gs = GradientState::instance();
    if (std::any_of(ddps_.begin(), ddps_.end(), [](const auto& d) { return d->sync(); })) refuse_starved("backward (the gradient all-reduce)");
    const bool recording = gs.recording();
    std::vector<std::uint64_t> before;
    if (recording)
      for (const auto& d : ddps_) before.push_back(d->backward_count());
    const at::Tensor l = opt_.gradient_accumulation_steps > 1 ? loss / double(opt_.gradient_accumulation_steps) : loss;
    if (scaler_) scaler_->scale(l).backward();
    else l.backward();
    if (!recording) return;
    Ddps through;  // the prepared models this backward went through: a rank out of batches averages theirs
    for (std::size_t i = 0; i < ddps_.size(); ++i)
      if (ddps_[i]->backward_count() != before[i]) through.push_back(ddps_[i]);
    record(GradientState::CallKind::collective, [through] {
      for (const auto& d : through) d->synchronize();
      return nullptr;
    });
  }

  // [accelerate:accelerator.py Accelerator.clip_grad_norm_]
  //! Unscales the gradients (fp16) then clips their total norm; returns the norm before clipping. Under fp16,
  //! call it on synchronising steps only (`sync_gradients()`): gradients are unscaled once per step.
  double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) {
    // A rank out of batches clips on synchronising steps, where its gradients are the others' average.
    record(GradientState::CallKind::local, [this, parameters, max_norm, norm_type] {
      if (sync_gradients()) clip_grad_norm_(parameters, max_norm, norm_type);
      return nullptr;
    });
    unscale_gradients();
    if constexpr (config::zero_stage == 2) {
      auto [parts, whole] = gradients_of(parameters);
      return clip_partitioned_norm(state_.comm(), parts, whole, max_norm, norm_type);
    }
    return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  }
  template <class M>
    requires ModuleHandle<M> || is_prepared_model<M>
  double clip_grad_norm_(const M& model, double max_norm, double norm_type = 2.0) {
    return clip_grad_norm_(module_of(unwrap_model(model))->parameters(), max_norm, norm_type);
  }
  // [accelerate:accelerator.py Accelerator.clip_grad_value_]
  //! Unscales the gradients (fp16) then clamps every gradient element into `[-clip_value, clip_value]`. Under
  //! fp16, call it on synchronising steps only (`sync_gradients()`), as `clip_grad_norm_`.
  void clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value) {
    // A rank out of batches clips on synchronising steps, where its gradients are the others' average.
    record(GradientState::CallKind::local, [this, parameters, clip_value] {
      if (sync_gradients()) clip_grad_value_(parameters, clip_value);
      return nullptr;
    });
    unscale_gradients();
    if constexpr (config::zero_stage == 2) {
      auto [parts, whole] = gradients_of(parameters);
      for (auto& g : parts) g.clamp_(-clip_value, clip_value);
      for (auto& g : whole) g.clamp_(-clip_value, clip_value);
      return;
    }
    torch::nn::utils::clip_grad_value_(parameters, clip_value);
  }
  template <class M>
    requires ModuleHandle<M> || is_prepared_model<M>
  void clip_grad_value_(const M& model, double clip_value) {
    clip_grad_value_(module_of(unwrap_model(model))->parameters(), clip_value);
  }
  //! Divides every prepared optimizer's gradients by the loss scale (fp16; nothing otherwise).
  void unscale_gradients() {
    if (scaler_)
      for (auto& o : optimizers_) scaler_->unscale_(o.sharded ? o.sharded->gradient_holder() : *o.optimizer);
  }

  //! RAII: the forward pass runs in `Options::mixed_precision` (bf16 or fp16 autocast on this process's
  //! device); disabled under `Precision::no`.
  [[nodiscard]] AutocastScope autocast() const {
    const auto dtype = opt_.mixed_precision == Precision::fp16 ? at::kHalf : at::kBFloat16;
    return {state_.device().type(), dtype, opt_.mixed_precision != Precision::no};
  }

  //! Gathers a batch's results from every process, dropping the padding of the current batch exactly
  //! (inside a prepared loader's loop; outside one it is a plain `gather`).
  //! Under uneven tails, a rank out of batches contributes no rows (Note [Joined steps]): every real sample
  //! is gathered exactly once.
  template <TensorStructure T>
  [[nodiscard]] T gather_for_metrics(const T& x) const {
    if (!GradientState::instance().in_dataloader()) return accel::gather(state_.comm(), x);
    return gather_batch(x, [&x] {
      return map_tensors(x, [](const at::Tensor& t) {  // this rank's rows at a step it lacks
        auto shape = t.sizes().vec();
        if (shape.empty()) shape.push_back(0);
        else shape[0] = 0;
        return at::empty(shape, t.options());
      });
    });
  }
  // [accelerate:accelerator.py Accelerator.gather_for_metrics]
  //! The same for objects (Accelerate's `use_gather_object` path, which it takes for non-tensor data): one
  //! element per sample of the batch, of any serialisable type (core/serialize.hpp); every rank gets the ranks'
  //! elements in rank order without the padding, exactly the samples the tensor form keeps for the same batch.
  //! Outside a prepared loader's loop it is every rank's elements, concatenated (Accelerate's `gather_object`).
  template <class T>
    requires(!TensorStructure<std::vector<T>>)
  [[nodiscard]] std::vector<T> gather_for_metrics(const std::vector<T>& x) const {
    if (!GradientState::instance().in_dataloader()) return concat_rows(accel::gather_object(state_.comm(), x));
    return gather_batch(x, [] { return std::vector<T>{}; });
  }
  //! Every rank's `x`, concatenated (shapes must agree: under uneven tails a rank out of batches contributes
  //! zeros of the shape it last gathered; use `gather_for_metrics` for a batch's rows).
  template <TensorStructure T>
  [[nodiscard]] T gather(const T& x) const {
    refuse_starved("gather");
    if (GradientState::instance().recording())
      record(GradientState::CallKind::collective, [this, zeros = map_tensors(x, [](const at::Tensor& t) { return at::zeros_like(t); })] {
        (void)gather(zeros);
        return nullptr;
      });
    return accel::gather(state_.comm(), x);
  }
  // [accelerate:accelerator.py Accelerator.reduce]
  //! The reduction of `x` over the processes, times `scale`: the sum by default, as Accelerate's
  //! `Accelerator.reduce` (the module function `accel::reduce` defaults to the mean, as Accelerate's). Under
  //! uneven tails a rank out of batches contributes the operation's identity (zero for sum and mean, as Join).
  template <TensorStructure T>
  [[nodiscard]] T reduce(const T& x, Reduction op = Reduction::sum, double scale = 1.0) const {
    refuse_starved("reduce");
    if (GradientState::instance().recording())
      record(GradientState::CallKind::collective, [this, op, scale, identity = map_tensors(x, [op](const at::Tensor& t) { return identity_like(t, op); })] {
        (void)reduce(identity, op, scale);
        return nullptr;
      });
    return accel::reduce(state_.comm(), x, op, scale);
  }

  // [accelerate:accelerator.py Accelerator.set_trigger]
  //! Sets this process's trigger: the next `check_trigger` returns true on every process. For stopping every
  //! process's loop together when one of them decides to (early stopping, a NaN loss):
  //! \code
  //! if (loss.isnan().item<bool>()) acc.set_trigger();   // on whichever process sees it
  //! if (acc.check_trigger()) break;                      // every process, every step: all leave together
  //! \endcode
  void set_trigger() noexcept { trigger_ = 1; }
  // [accelerate:accelerator.py Accelerator.check_trigger]
  //! Whether any process has set its trigger since its last check (the sum of the flags over the processes);
  //! when it has, every process's flag is reset. A collective: every process calls it at the same point (one
  //! process: no communication). Under uneven tails a rank out of batches repeats it with its own flag (0 unless
  //! it set the trigger after its last check); when the others stop there, its repeated steps end too
  //! (Note [Joined steps]).
  [[nodiscard]] bool check_trigger() {
    if (state_.comm() == nullptr) return std::exchange(trigger_, 0) != 0;
    refuse_starved("check_trigger");
    if (GradientState::instance().recording())
      record(GradientState::CallKind::collective, [this] {
        if (check_trigger()) GradientState::instance().stop_repeating();  // the others leave their loops here
        return nullptr;
      });
    const bool any = reduce_flag(trigger_, Reduction::sum) > 0;
    if (any) trigger_ = 0;
    return any;
  }

  //! Whether this step synchronises gradients (the optimizer really steps).
  [[nodiscard]] bool sync_gradients() const { return GradientState::instance().sync_gradients(); }
  [[nodiscard]] int gradient_accumulation_steps() const noexcept { return opt_.gradient_accumulation_steps; }
  //! Accelerate's `Accelerator.step`: accumulation steps since the last reset.
  [[nodiscard]] std::int64_t step() const noexcept { return accumulation_.step(); }
  //! Whether any prepared optimizer skipped its last step (inf/NaN under fp16).
  [[nodiscard]] bool optimizer_step_was_skipped() const {
    for (const auto& o : optimizers_)
      if (o.record->skipped) return true;
    return false;
  }
  [[nodiscard]] GradScaler* scaler() const noexcept { return scaler_.get(); }
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  // ---- processes -----------------------------------------------------------------------------------------

  [[nodiscard]] const ProcessState& state() const noexcept { return state_; }
  [[nodiscard]] comm::Communicator* comm() const noexcept { return state_.comm(); }
  [[nodiscard]] const c10::Device& device() const noexcept { return state_.device(); }
  [[nodiscard]] int num_processes() const noexcept { return state_.num_processes(); }
  [[nodiscard]] int process_index() const noexcept { return state_.process_index(); }
  [[nodiscard]] bool is_main_process() const noexcept { return state_.is_main_process(); }
  [[nodiscard]] bool is_local_main_process() const noexcept { return state_.is_local_main_process(); }
  [[nodiscard]] int local_process_index() const noexcept { return state_.local_process_index(); }
  [[nodiscard]] bool is_last_process() const noexcept { return state_.is_last_process(); }
  // [accelerate:accelerator.py Accelerator.on_main_process]
  //! Runs `f()` on the main process only; `bool` (whether it ran) for an `f` returning nothing, else
  //! `std::optional` of its result (`ProcessState::on_main_process`). The `on_*` helpers do not communicate.
  template <std::invocable F>
  OnProcessResult<F> on_main_process(F&& f) const { return state_.on_main_process(std::forward<F>(f)); }
  // [accelerate:accelerator.py Accelerator.on_local_main_process]
  //! Runs `f()` on the main process of each node only.
  template <std::invocable F>
  OnProcessResult<F> on_local_main_process(F&& f) const { return state_.on_local_main_process(std::forward<F>(f)); }
  // [accelerate:accelerator.py Accelerator.on_last_process]
  //! Runs `f()` on the last process only.
  template <std::invocable F>
  OnProcessResult<F> on_last_process(F&& f) const { return state_.on_last_process(std::forward<F>(f)); }
  // [accelerate:accelerator.py Accelerator.on_process]
  //! Runs `f()` on the process `index` only (an index outside `[0, num_processes())` is an error).
  template <std::invocable F>
  OnProcessResult<F> on_process(int index, F&& f) const { return state_.on_process(index, std::forward<F>(f)); }
  // [accelerate:accelerator.py Accelerator.on_local_process]
  //! Runs `f()` on the process of local index `local_index` of each node (outside `[0, local processes)`: an error).
  template <std::invocable F>
  OnProcessResult<F> on_local_process(int local_index, F&& f) const {
    return state_.on_local_process(local_index, std::forward<F>(f));
  }
  void wait_for_everyone() const { state_.wait_for_everyone(); }
  [[nodiscard]] auto main_process_first() const { return state_.main_process_first(); }
  template <class... Args>
  void print(const Args&... args) const { state_.print(args...); }

  // ---- checkpoints (checkpoint/checkpointer.hpp; layout: checkpoint/format.hpp) ---------------------------------

  // [accelerate:accelerator.py Accelerator.save_state]
  //! Saves every prepared model, optimizer, scheduler and loader, the scaler, every process's generators and
  //! the step counter into `dir` (replaced whole once every process has written its part). Every process calls it.
  void save_state(const std::filesystem::path& dir) {
    checkpointer_.save(dir, checkpoint_process(), accumulation_.step(), /*local_gradients=*/!sync_gradients());
  }

  //! `save_state` under `ProjectConfiguration::automatic_checkpoint_naming`: into
  //! `<project_dir>/checkpoints/checkpoint_<iteration>` (an existing one is an error: nothing is overwritten);
  //! once it is complete, the oldest complete checkpoints beyond `total_limit` are removed and `iteration`
  //! grows by one. Returns the checkpoint's directory. Every process calls it.
  std::filesystem::path save_state() {
    auto& project = opt_.project_config;
    agree_on_main("save_state", [&] { (void)checkpoint::next_checkpoint_dir(project); });
    const auto dir = checkpoint::numbered_dir(project, project.iteration);
    save_state(dir);
    if (is_main_process())
      for (const auto& problem : checkpoint::prune_checkpoints(project, project.iteration))
        std::fprintf(stderr, "accel: warning: total_limit: %s\n", problem.c_str());
    ++project.iteration;
    return dir;
  }

  // [accelerate:accelerator.py Accelerator.load_state]
  //! Restores what `save_state` wrote into the objects prepared (in the same order) by this job. Every
  //! process calls it; the next batch of each loader is the one after the checkpoint. The checkpoint may come from
  //! a job of another number of processes (README, "Resuming at another world size"): the interrupted epoch goes on
  //! over exactly the samples that job had not consumed; a rank it did not have takes rank 0's generators; one
  //! saved inside an accumulation window resumes only with its own number of processes. Under automatic naming,
  //! the next `save_state()` numbers after the project's latest checkpoint.
  void load_state(const std::filesystem::path& dir) {
    restore(dir, opt_.project_config.automatic_checkpoint_naming ? latest_checkpoint_number() : std::nullopt);
  }
  //! `load_state` of the project's latest complete checkpoint (automatic naming; a checkpoint being written is
  //! never chosen). Returns its directory. Every process calls it.
  std::filesystem::path load_state() {
    agree_on_main("load_state", [&] { (void)checkpoint::checkpoint_to_resume(opt_.project_config); });
    const auto latest = latest_checkpoint_number();  // there is one: the main process found it
    const auto dir = checkpoint::numbered_dir(opt_.project_config, *latest);
    restore(dir, latest);
    return dir;
  }
  //! The project's latest complete checkpoint, if any, as the main process sees it (every process calls it,
  //! so that all take the same decision, e.g. whether to `load_state()`).
  [[nodiscard]] std::optional<std::filesystem::path> latest_checkpoint() const {
    const auto n = latest_checkpoint_number();
    if (!n) return std::nullopt;
    return checkpoint::numbered_dir(opt_.project_config, *n);
  }

  // [accelerate:accelerator.py Accelerator.register_for_checkpointing]
  //! Adds objects to what `save_state` saves and `load_state` restores, after the prepared ones, in the order
  //! of registration: anything with `save(OutputArchive&) const` / `load(InputArchive&)` (a module, an
  //! optimizer), with `state_dict()` / `load_state_dict(s)` of a serialisable state, or itself serialisable (a
  //! counter, a struct with `accel_fields`); see checkpoint/custom.hpp. Pass a `std::shared_ptr` (kept alive)
  //! or an lvalue that outlives every `save_state` / `load_state`. The main process writes them; every process
  //! restores them. Loading with other objects registered (count or types) is an error naming them.
  template <class... Objects>
  void register_for_checkpointing(Objects&&... objects) {
    static_assert(sizeof...(Objects) > 0, "accel::Accelerator::register_for_checkpointing: pass at least one object");
    (register_one(std::forward<Objects>(objects)), ...);
  }

  // [accelerate:accelerator.py Accelerator.save_model]
  //! Writes the (unwrapped) model's parameters and buffers as safetensors into `dir`: `model.safetensors`, or
  //! above `max_shard_size` shards and `model.safetensors.index.json`, named and split as Accelerate does
  //! (checkpoint/safetensors.hpp). Every process calls it; the main process writes, the others wait for it, and
  //! a failure there is raised on every process.
  template <class M>
    requires ModuleHandle<M> || is_prepared_model<M>
  void save_model(const M& model, const std::filesystem::path& dir, const checkpoint::SaveModelOptions& options = {}) {
    std::exception_ptr failure;
    std::string message;
    if (is_main_process()) {
      try {
        checkpoint::save_model(*module_of(unwrap_model(model)), dir, options);
      } catch (const std::exception& e) {
        failure = std::current_exception();
        message = e.what();
      }
    }
    message = broadcast_object(comm(), message);  // the others' barrier, and the main process's outcome
    if (failure) std::rethrow_exception(failure);
    if (!message.empty()) throw Error(message + " (raised on the main process)");
  }

  // ---- experiment trackers (tracking/trackers.hpp) ------------------------------------------------------------

  // [accelerate:accelerator.py Accelerator.init_trackers]
  //! Starts the trackers of `Options::log_with` for the run `project_name` with its hyperparameters `config`:
  //! on the main process only (the others write nothing), into `<logging_dir()>/<project_name>/`. After a
  //! `load_state` the run's files are continued (appended to), otherwise started anew.
  void init_trackers(const std::string& project_name, const tracking::Values& config = {}) {
    detail::require(!project_name.empty(), "accel::Accelerator::init_trackers: the project name is empty");
    // Every process checks the names (the main process's Trackers does), so that each raises the same error.
    if (is_main_process()) trackers_ = tracking::Trackers(opt_.log_with, logging_dir() / project_name, config, resumed_);
    else tracking::Trackers::check_names(config, "init_trackers");
    trackers_started_ = true;
  }
  // [accelerate:accelerator.py Accelerator.log]
  //! Logs one step's values to every tracker (main process only; a no-op elsewhere). Without `step`, the step
  //! is the number of `log` calls before this one.
  void log(const tracking::Values& values, std::optional<std::int64_t> step = std::nullopt) {
    detail::require(trackers_started_, "accel::Accelerator::log: no run is being tracked; call init_trackers first");
    if (is_main_process()) trackers_.log(values, step);
    else tracking::Trackers::check_names(values, "log");
  }
  // [accelerate:accelerator.py Accelerator.end_training]
  //! Closes the trackers' files, then waits for every process (so that all may read them afterwards).
  void end_training() {
    stop_tracking();
    wait_for_everyone();
  }
  //! Where trackers write: `Options::logging_dir`, else the project's `logging_dir`, else its `project_dir`.
  [[nodiscard]] std::filesystem::path logging_dir() const {
    if (!opt_.logging_dir.empty()) return opt_.logging_dir;
    const auto& p = opt_.project_config;
    return p.logging_dir.empty() ? p.project_dir : p.logging_dir;
  }

 private:
  using Ddps = std::vector<std::shared_ptr<DistributedModule>>;

  void record_accumulate(Ddps ddps) {
    record(GradientState::CallKind::accumulate, [this, ddps = std::move(ddps)] {
      accumulation_.begin_step();
      auto scope = std::make_shared<SyncScope>();
      if (!accumulation_.allow_sync())
        for (const auto& d : ddps) scope->hold(d.get());
      return scope;
    });
  }
  SyncScope no_sync_of(const Ddps& ddps) {
    SyncScope scope;
    for (const auto& d : ddps) scope.hold(d.get());
    if (GradientState::instance().recording()) {
      // Repeated as it ran: held from here until the scope ended (its end is recorded too).
      auto slot = std::make_shared<std::shared_ptr<SyncScope>>();
      record(GradientState::CallKind::local, [this, ddps, slot] {
        *slot = std::make_shared<SyncScope>(no_sync_of(ddps));
        return nullptr;
      });
      scope.on_release([slot] { record(GradientState::CallKind::local, [slot] { return slot->reset(), nullptr; }); });
    }
    return scope;
  }
  //! `gather_for_metrics` inside a loader's loop, for tensors and objects alike; `none` makes this rank's
  //! contribution to a step it lacks (no rows).
  template <class T, class None>
  T gather_batch(const T& x, None none) const {
    auto& gs = GradientState::instance();
    refuse_starved("gather_for_metrics");
    if (!gs.recording()) return accel::gather_for_metrics(state_.comm(), x, gs.layout());
    const T empty = none();
    const auto ahead = gs.gather_ahead();  // this rank's last batch of an uneven evaluation: the others' rows too
    record(GradientState::CallKind::gather_for_metrics, [this, empty] {
      (void)gather_for_metrics(empty);
      return nullptr;
    });
    T out = accel::gather_for_metrics(state_.comm(), x, gs.layout());
    if (ahead.empty()) return out;
    std::vector<T> parts{std::move(out)};
    for (const auto& layout : ahead) parts.push_back(accel::gather_for_metrics(state_.comm(), empty, layout));
    return concat_rows(std::move(parts));
  }
  //! Records a call of the loop's step for a rank that will run out of batches (Note [Joined steps] in
  //! gradient_state.hpp); nothing, and no copy of the arguments, on any other rank or loader.
  template <class F>
  static void record(GradientState::CallKind kind, F&& call) {
    auto& gs = GradientState::instance();
    if (!gs.recording()) return;
    gs.record(kind, [f = std::forward<F>(call)]() -> std::shared_ptr<void> { return f(); });
  }
  //! The rows of several gathers of one structure, concatenated tensor by tensor.
  template <TensorStructure T>
  static T concat_rows(const std::vector<T>& parts) {
    std::vector<std::vector<at::Tensor>> columns;
    for (const auto& p : parts) {
      std::size_t i = 0;
      for_each_tensor(p, [&](const at::Tensor& t) {
        if (columns.size() <= i) columns.emplace_back();
        columns[i++].push_back(t);
      });
    }
    std::size_t i = 0;
    return map_tensors(parts.front(), [&](const at::Tensor&) { return at::cat(columns[i++], 0); });
  }
  //! The elements of several gathers of objects, concatenated.
  template <class U>
    requires(!TensorStructure<std::vector<U>>)
  static std::vector<U> concat_rows(std::vector<std::vector<U>> parts) {
    std::vector<U> out;
    for (auto& p : parts) std::move(p.begin(), p.end(), std::back_inserter(out));
    return out;
  }
  //! A collective in an epoch where some rank has no batch at all: that rank has no step to repeat, so the
  //! collective could never be matched; every rank knows it from the plan and stops here, with the same error.
  void refuse_starved(const char* what) const {
    const int r = GradientState::instance().starved_rank();
    if (r < 0) return;
    throw InvalidArgument("accel: rank " + std::to_string(process_index()) + ": " + what + " in an epoch in which the "
                          "uneven loader (tail::uneven) gives rank " + std::to_string(r) + " no batch at all: a rank "
                          "without a batch has no step to follow, so it cannot take part in the others' collectives. "
                          "Use tail::even, fewer processes or a smaller batch size");
  }
  //! What a rank without a batch contributes to a reduction: zero for sum and mean, the dtype's lowest value for
  //! max and its highest for min.
  static at::Tensor identity_like(const at::Tensor& t, Reduction op) {
    if (op != Reduction::max && op != Reduction::min) return at::zeros_like(t);
    at::Tensor out = at::empty_like(t);
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, t.scalar_type(), "accel_identity_like", [&] {
      using L = std::numeric_limits<scalar_t>;
      const scalar_t v = op == Reduction::max ? (L::has_infinity ? scalar_t(-L::infinity()) : L::lowest())
                                              : (L::has_infinity ? L::infinity() : L::max());
      out.fill_(c10::Scalar(v));
    });
    return out;
  }

  struct OptimizerEntry {
    std::shared_ptr<torch::optim::Optimizer> optimizer;
    std::shared_ptr<const StepRecord> record;
    std::shared_ptr<ShardedOptimizer> sharded;  // ZeRO stage 1's partition (nullptr: not sharded)
  };
  [[nodiscard]] checkpoint::Checkpointer::Process checkpoint_process() const {
    return {process_index(), num_processes(), device(), [this] { wait_for_everyone(); }};
  }
  //! `load_state(dir)`; `latest`: the project's latest checkpoint number under automatic naming (the next
  //! `save_state()` numbers after it).
  void restore(const std::filesystem::path& dir, std::optional<std::int64_t> latest) {
    accumulation_.set_step(checkpointer_.load(dir, checkpoint_process()));
    resumed_ = true;
    if (latest) opt_.project_config.iteration = std::max(opt_.project_config.iteration, *latest + 1);
  }
  //! The trackers' files closed (end_training, preemption).
  void stop_tracking() {
    trackers_.finish();
    trackers_started_ = false;
  }
  //! `v` reduced over the processes (a flag: set_trigger's, a preemption signal).
  [[nodiscard]] std::int64_t reduce_flag(std::int64_t v, Reduction op) const {
    return accel::reduce(state_.comm(), detail::long_tensor(v, state_.comm()->device()), op).item<std::int64_t>();
  }
  //! Runs `check` on the main process (the project folder as it sees it) and raises its error on every process.
  template <class Check>
  void agree_on_main(const char* what, Check&& check) const {
    std::string problem;
    if (is_main_process()) try {
        check();
      } catch (const std::exception& e) {
        problem = e.what();
        if (problem.empty()) problem = std::string("accel::Accelerator::") + what + " failed";
      }
    problem = broadcast_object(comm(), problem);
    if (!problem.empty()) throw InvalidArgument(problem);
  }
  //! The number of the project's latest complete checkpoint, as the main process sees it (a collective).
  [[nodiscard]] std::optional<std::int64_t> latest_checkpoint_number() const {
    std::int64_t n = -1;
    if (is_main_process())
      if (const auto latest = checkpoint::latest_checkpoint(opt_.project_config)) n = latest->number;
    n = broadcast_object(comm(), n);
    return n < 0 ? std::nullopt : std::optional<std::int64_t>(n);
  }
  template <class T>
  void register_one(T&& object) {
    using U = std::remove_cvref_t<T>;
    if constexpr (ModuleHandle<U>) {
      auto m = module_of(object);
      auto c = checkpoint::Custom::of(*m, m);
      c.type = m->name();
      checkpointer_.add_custom(std::move(c));
    } else if constexpr (!std::is_void_v<detail::shared_t<U>>) {
      using V = detail::shared_t<U>;
      static_assert(checkpoint::Checkpointable<V>, "accel::Accelerator::register_for_checkpointing: the object has neither save(OutputArchive&) "
                                                   "const / load(InputArchive&), nor state_dict() / load_state_dict() of a serialisable state, "
                                                   "nor is it serialisable itself (give a struct an accel_fields overload)");
      if constexpr (checkpoint::Checkpointable<V>) {
        detail::require(object != nullptr, "accel::Accelerator::register_for_checkpointing: a null std::shared_ptr");
        checkpointer_.add_custom(checkpoint::Custom::of(*object, object));
      }
    } else {
      static_assert(std::is_lvalue_reference_v<T> && !std::is_const_v<std::remove_reference_t<T>>,
                    "accel::Accelerator::register_for_checkpointing: pass a non-const lvalue (it is restored in place and "
                    "must outlive the job's save_state / load_state) or a std::shared_ptr");
      static_assert(checkpoint::Checkpointable<U>, "accel::Accelerator::register_for_checkpointing: the object has neither save(OutputArchive&) "
                                                   "const / load(InputArchive&), nor state_dict() / load_state_dict() of a serialisable state, "
                                                   "nor is it serialisable itself (give a struct an accel_fields overload)");
      if constexpr (checkpoint::Checkpointable<U> && std::is_lvalue_reference_v<T>) checkpointer_.add_custom(checkpoint::Custom::of(object));
    }
  }
  //! Points GradientState's step boundary hook at this accelerator (under `Options::preemption`): at
  //! construction, and again wherever the loop passes after the accelerator was moved (a moved-from one clears
  //! its own hook when it goes).
  void bind_boundary_hook() {
    if (signals_.active() && GradientState::instance().step_boundary_owner() != this)
      GradientState::instance().set_step_boundary_hook(this, [this] { at_step_boundary(); });
  }
  //! `Options::preemption` at a step boundary (GradientState's hook): after an optimizer step, every process
  //! learns whether any was signalled; if so all save and stop together.
  void at_step_boundary() {
    std::uint64_t steps = 0;
    for (const auto& o : optimizers_) steps += o.record->steps;
    if (steps < boundary_steps_ + std::uint64_t(opt_.preemption.check_every)) return;  // not a step boundary, or not yet
    boundary_steps_ = steps;
    int sig = detail::SignalWatch::received();
    if (num_processes() > 1) sig = int(reduce_flag(sig, Reduction::max));
    if (sig == 0) return;
    print("accel: signal ", sig, " received; saving a checkpoint at this step boundary, then stopping");
    const auto dir = save_state();
    stop_tracking();
    detail::SignalWatch::clear();
    print("accel: checkpoint saved to ", dir.string(), "; resume with load_state()");
    if (opt_.preemption.exit) {
      std::fflush(nullptr);
      std::_Exit(opt_.preemption.exit_code);  // no destructors: the loader's workers and the engine's threads still run
    }
    throw Preempted(sig, dir);
  }

  template <class T>
  auto first_pass(T&& x) {
    using U = std::remove_cvref_t<T>;
    constexpr auto kind = detail::classify<T>();
    if constexpr (kind == detail::Prepares::model) {
      auto module = module_of(x);
      if constexpr (config::device_placement) module->to(device());
      const std::size_t collective = set_communicators(*module, state_.comm());  // its SyncBatchNorms use this job's processes
      // A rank out of batches under uneven tails repeats the others' gradient collectives, not a forward's batch
      // statistics (PyTorch's join does not support SyncBatchNorm either): refused here rather than hung later.
      if constexpr (!config::even_batches && !one_process)
        detail::require(collective == 0 || num_processes() == 1,
                        "accel::Accelerator::prepare: the model holds " + std::to_string(collective) + " SyncBatchNorm (or other "
                        "module that communicates in its forward); under accel::tail::uneven a rank out of batches cannot "
                        "take part in the others' batch statistics: use accel::tail::even (the default), or BatchNorm");
      checkpointer_.add_model(module);
      if constexpr (one_process) {
        return U(std::forward<T>(x));
      } else {
        auto ddp = std::make_shared<DistributedModule>(
            module, state_.comm(), DistributedOptions{.bucket_bytes = opt_.bucket_bytes, .find_unused_parameters = opt_.find_unused_parameters,
                                                  .broadcast_buffers = opt_.broadcast_buffers, .comm_hook = opt_.comm_hook});
        ddps_.push_back(ddp);
        return PreparedModel<U>(std::forward<T>(x), std::move(ddp));
      }
    } else if constexpr (kind == detail::Prepares::optimizer) {
      using O = std::conditional_t<TorchOptimizer<U>, U, detail::shared_t<U>>;
      std::shared_ptr<O> p;
      if constexpr (TorchOptimizer<U>) p = std::make_shared<O>(std::move(x));
      else p = x;
      AcceleratedOptimizer<O> wrapped(p, scaler_);
      std::shared_ptr<ShardedOptimizer> sharded;
      if constexpr (config::zero_stage > 0 && !one_process) {
        static_assert(ShardableOptimizer<O>,
                      "accel::shard::optimizer shards optimizers whose state is per parameter and whose update is "
                      "elementwise (torch::optim::SGD, Adam, AdamW, RMSprop, Adagrad), and so does accel::shard::gradients; "
                      "this optimizer (LBFGS, or one of "
                      "your own) is not known to be: use accel::shard::none, or specialise accel::ShardTraits for it");
        if constexpr (ShardableOptimizer<O>) {
          sharded = std::make_shared<ShardedOptimizer>(p, state_.comm(), config::zero_stage);
          wrapped.set_sharded(sharded);
        }
      }
      checkpointer_.add_optimizer({[wrapped](auto& a) { wrapped.save(a); }, [wrapped](auto& a) mutable { wrapped.load(a); }});
      if (sharded)
        checkpointer_.add_partition({{[sharded](auto& a) { sharded->save(a); }, [sharded](auto& a) { sharded->load(a); },
                                      [sharded](auto& a) { sharded->check(a); }},
                                     [sharded](auto& parts) { sharded->check_resharded(parts); },
                                     [sharded](auto& parts) { sharded->load_resharded(parts); }});
      optimizers_.push_back({p, wrapped.record(), sharded});
      return wrapped;
    } else if constexpr (kind == detail::Prepares::scheduler) {
      return detail::PendingScheduler<detail::shared_t<U>>{x};
    } else if constexpr (kind == detail::Prepares::loader) {
      return register_loader(data::prepare_data_loader<config>(x, state_));
    } else {
      return detail::NotPrepared{};  // the static_assert in prepare has said why
    }
  }
  template <class T>
  auto second_pass(T&& x) {
    if constexpr (requires { x.scheduler; }) {
      using S = typename std::remove_cvref_t<decltype(*x.scheduler)>;
      std::vector<std::shared_ptr<const StepRecord>> records;
      for (const auto& o : optimizers_) records.push_back(o.record);
      AcceleratedScheduler<S> wrapped(std::move(x.scheduler), std::move(records),
                                      {.num_processes = num_processes(), .split_batches = config::split_batches,
                                       .step_with_optimizer = opt_.step_scheduler_with_optimizer, .always_once = opt_.scheduler_steps_once});
      checkpointer_.add_scheduler({[wrapped](auto& a) { wrapped.save(a); }, [wrapped](auto& a) mutable { wrapped.load(a); }});
      return wrapped;
    } else {
      return std::forward<T>(x);
    }
  }
  template <class Loader>
  Loader register_loader(Loader l) {
    checkpointer_.add_loader({[l] { return l.state_dict(); },
                              [l](const data::LoaderState& s) mutable { l.load_state_dict(s, data::GlobalGenerator::restored_by_caller); },
                              [l](const data::LoaderState& s) { return l.state_mismatch(s); }});
    return l;
  }

  // ZeRO stage 2: each prepared model's gradients go to the partitions of the sharded optimizer that holds its
  // parameters (models prepared before their optimizer are bound when it is prepared).
  void shard_gradients() {
    for (const auto& d : ddps_) {
      if (d->shards_gradients()) continue;
      const void* first = nullptr;
      for (const auto& p : d->module().parameters())
        if (p.requires_grad()) { first = p.unsafeGetTensorImpl(); break; }
      if (!first) continue;
      for (const auto& o : optimizers_) {
        if (!o.sharded) continue;
        GradientPartition layout = o.sharded->gradient_partition();
        if (layout.offsets.count(first)) {
          d->shard_gradients(std::move(layout));
          break;
        }
      }
    }
  }
  // ZeRO stage 2: this rank's part of the partitioned gradients of `parameters`, and the whole gradients of the
  // others (parameters of no sharded optimizer).
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> gradients_of(const std::vector<at::Tensor>& parameters) const {
    std::vector<at::Tensor> parts, whole;
    std::unordered_set<const void*> covered;
    for (const auto& o : optimizers_)
      if (o.sharded)
        for (auto& g : o.sharded->owned_gradients(parameters, covered)) parts.push_back(std::move(g));
    for (const auto& p : parameters)
      if (!covered.count(p.unsafeGetTensorImpl()) && p.grad().defined()) whole.push_back(p.grad());
    return {std::move(parts), std::move(whole)};
  }

  void check_optimizer_parameters(std::size_t first) const {
    if (checkpointer_.models().empty()) return;
    std::unordered_set<const void*> known;
    for (const auto& m : checkpointer_.models())
      for (const auto& p : m->parameters()) known.insert(p.unsafeGetTensorImpl());
    for (std::size_t i = first; i < optimizers_.size(); ++i) {
      const auto& groups = optimizers_[i].optimizer->param_groups();
      for (std::size_t g = 0; g < groups.size(); ++g)
        for (std::size_t k = 0; k < groups[g].params().size(); ++k) {
          const auto& p = groups[g].params()[k];
          if (known.count(p.unsafeGetTensorImpl())) continue;
          std::string shape;
          for (auto d : p.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
          throw InvalidArgument("accel::Accelerator::prepare: optimizer #" + std::to_string(i) + " holds a parameter (group " +
                                std::to_string(g) + ", index " + std::to_string(k) + ", shape [" + shape +
                                "]) that belongs to no prepared model; build the optimizer from the prepared model's "
                                "parameters(), and prepare that model too");
        }
    }
  }

  template <class M>
  static std::shared_ptr<DistributedModule> distributed_of(const M& m) {
    if constexpr (is_prepared_model<M>) return m.distributed_ptr();
    else return nullptr;  // dist::none: nothing to keep local
  }

  Options opt_;
  ProcessState state_;
  Accumulation accumulation_;
  std::shared_ptr<GradScaler> scaler_;
  std::vector<OptimizerEntry> optimizers_;
  Ddps ddps_;  // every prepared model's gradient synchroniser
  checkpoint::Checkpointer checkpointer_;  // every prepared object, in prepare order
  tracking::Trackers trackers_;            // the run's writers (none but on the main process)
  bool trackers_started_ = false;          // init_trackers was called (on every process)
  detail::SignalWatch signals_;            // Options::preemption's signals, while this accelerator lives
  std::uint64_t boundary_steps_ = 0;       // optimizer steps at the last step boundary
  bool resumed_ = false;                   // load_state was called: init_trackers continues the run's files
  std::int64_t trigger_ = 0;               // set_trigger's flag, until check_trigger finds it
};

}  // namespace accel
