#pragma once
//! \file
//! `Accelerator<Policies...>`: the object a training loop talks to.
//!
//! \code
//! struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::per_process> {};
//!
//! Acc acc{accel::Options{.seed = 42, .gradient_accumulation_steps = 4}};
//! auto [model, opt, loader, sched] = acc.prepare(net, std::make_shared<torch::optim::AdamW>(net->parameters()),
//!                                                accel::data::DataLoader(dataset, {.batch_size = 64, .shuffle =
//!                                                true}), std::make_shared<torch::optim::StepLR>(*adamw, 100));
//! for (const auto& batch : loader) {
//!   auto step = acc.accumulate(model);                 // sync decision; no_sync on accumulation steps
//!   auto ac = acc.autocast();                           // bf16/fp16 forward under Options::mixed_precision
//!   acc.backward(loss_fn(model(batch.data), batch.target));  // model(x): the prepared model's door
//!   opt.step(); sched.step(); opt.zero_grad();          // real steps only when gradients are synchronised
//! }
//! acc.save_state("checkpoints/last");
//! \endcode
//!
//! Deriving a named struct (rather than a `using` alias) keeps diagnostics short: they say `Acc`.
//! A wrong configuration stops the build with exactly one of the messages of `CheckedConfig` (config.hpp); a
//! wrong argument to `prepare` with one message too. Run-time knobs that never change a type are in `Options`.
//!
//! Declared here with its constructor and short accessors; its other members are defined in accelerator/loop.hpp,
//! accelerator/prepare.hpp and accelerator/checkpoints.hpp, included at the end. `Options`: accelerator/options.hpp.

#include <accel/accelerator/options.hpp>
#include <accel/checkpoint/checkpointer.hpp>
#include <accel/checkpoint/project.hpp>
#include <accel/checkpoint/safetensors.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/config.hpp>
#include <accel/data/prepare.hpp>
#include <accel/model/autocast.hpp>
#include <accel/model/prepared_model.hpp>
#include <accel/model/replicas.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/accumulation.hpp>
#include <accel/optim/grad_scaler.hpp>
#include <accel/state/gradient_state.hpp>
#include <accel/state/preemption.hpp>
#include <accel/state/process_state.hpp>
#include <accel/tracking/trackers.hpp>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel {

//! The training loop's one object (Accelerate's `Accelerator`), configured at compile time by its policies (any order,
//! at most one per slot: `dist`, `batches`, `tail`, `loading`, `rng`, `place`, `shard`) and at run time by `Options`.
//! It prepares models, optimizers, schedulers and loaders (`prepare`), runs the loop's steps (`accumulate`, `backward`,
//! `clip_grad_norm_`, `autocast`, `gather_for_metrics`, ...), saves and loads checkpoints (`save_state`, `load_state`)
//! and drives the trackers. Derive a named type from it: `struct Acc : accel::Accelerator<...> {};`.
template <class... Policies>
class Accelerator {
 public:
  //! The resolved configuration: `config::dist`, `config::split_batches`, `config::dispatch`, ... Naming it
  //! instantiates the checks: a wrong list of policies stops the build here with one message.
  using config = CheckedConfig<Policies...>;
  //! The configuration's problem (`ConfigProblem::none` for a valid one).
  static constexpr ConfigProblem problem = config::problem;
  //! `dist::none`: one process, nothing to wrap.
  static constexpr bool one_process = std::is_same_v<typename config::dist, dist::none>;
  //! The engine connecting the processes (state/engine.hpp); a configuration with a problem, which has already
  //! stopped the build with its message, falls back to `dist::none` so that it is the only error.
  using engine = std::conditional_t<problem == ConfigProblem::none, typename config::dist, dist::none>;

  //! Connects the process (the `dist` policy's engine, once per process: `ProcessState`), seeds the generators when
  //! `Options::seed` is set, and sets up accumulation, mixed precision, trackers' and checkpoints' settings from `o`.
  Accelerator(Options o = {})  // NOLINT: implicit, so that `Acc acc{accel::Options{...}}` reads well
      : opt_(o),
        state_(ProcessOptions{.launch = o.launch, .comm = o.comm}, engine{}),
        accumulation_({.steps = o.gradient_accumulation_steps,
                       .sync_with_dataloader = o.sync_with_dataloader,
                       .sync_each_batch = o.sync_each_batch}) {
    checkpoint::check_project(o.project_config);
    if (o.preemption.enabled) {
      detail::require(o.project_config.automatic_checkpoint_naming,
                      "accel: Options::preemption saves with save_state() under automatic checkpoint naming; set "
                      "Options::project_config.automatic_checkpoint_naming = true (and its project_dir)");
      detail::require(o.preemption.check_every >= 1, "accel: PreemptionOptions::check_every is " +
                                                         std::to_string(o.preemption.check_every) +
                                                         "; agree on signals every 1 or more optimizer steps");
      signals_ = detail::SignalWatch(o.preemption.signals);
    }
    detail::require(o.check_replicas_every >= 0, "accel: Options::check_replicas_every is " +
                                                     std::to_string(o.check_replicas_every) +
                                                     "; use 0 (no check) or a number of optimizer steps");
    detail::require(o.gradient_accumulation_steps >= 1, "accel: Options::gradient_accumulation_steps is " +
                                                            std::to_string(o.gradient_accumulation_steps) +
                                                            "; use 1 (no accumulation) or more");
    bind_boundary_hook();
    if (o.seed) set_seed(*o.seed, state_.process_index(), o.device_specific_seed);
    if (o.mixed_precision == Precision::fp16) {
      detail::require(state_.device().is_cuda(),
                      "accel: Precision::fp16 needs a GPU (fp16 training scales the loss on the "
                      "device); this process runs on the CPU: use Precision::bf16, or Precision::no");
      // not a step call: the scaler is built here (its step goes through the prepared optimizer's door)
      scaler_ = std::make_shared<GradScaler>(state_.device(), state_.comm(), o.scaler);
      checkpointer_.set_scaler({[s = scaler_](auto& a) { s->save(a); }, [s = scaler_](auto& a) { s->load(a); },
                                [s = scaler_](auto& a) { s->check(a); }});
    }
  }
  //! Movable; not copyable.
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
  //! | model: `std::shared_ptr<M>` or a module holder      | `PreparedModel<Holder>` (the holder itself under
  //! `dist::none`), moved to the device, rank 0's weights | | optimizer: `std::shared_ptr<O>` or `O&&`            |
  //! `AcceleratedOptimizer<O>`                        | | `data::DataLoader`                                  | the
  //! prepared loader of `config` (`ShardedLoader`, `DispatchedLoader`, ...) | | scheduler: `std::shared_ptr<S>` (an
  //! `LRScheduler`: LibTorch's, or optim/schedulers.hpp's PyTorch-exact ones) | `AcceleratedScheduler<S>`, held back by
  //! every prepared optimizer's skipped steps |
  //!
  //! An optimizer holding a parameter of no prepared model is an error (build it from the model's
  //! `parameters()`). The order of preparation is the order of the checkpoint's files.
  template <class... Ts>
  auto prepare(Ts&&... objects);

  //! Prepares a loader under `loading::dispatched` with a slice function for non-tensor fields.
  template <class Dataset, class Collate, class Slice>
  auto prepare_data_loader(const data::DataLoader<Dataset, Collate>& loader, Slice slice);

  // ---- the loop ------------------------------------------------------------------------------------------

  // [accelerate:accelerator.py Accelerator.accumulate]
  //! Call once per batch, before the forward pass; keep the result alive until after `backward`. Decides
  //! whether this step synchronises gradients (every `gradient_accumulation_steps`-th step and at the end of the
  //! loader); on the others the models' gradients stay local.
  template <class... Models>
  [[nodiscard]] SyncScope accumulate(const Models&... models);
  //! Gradients of `models` stay local while the result lives (Accelerate's `no_sync`).
  template <class... Models>
  [[nodiscard]] SyncScope no_sync(const Models&... models);

  // [accelerate:accelerator.py Accelerator.backward]
  //! `loss / gradient_accumulation_steps` (always, as in Accelerate), scaled under fp16, then backward. Warns once
  //! (main process) when accumulation is configured but no `accumulate` scope decided this step (every step would
  //! then synchronise and step), when a prepared model's parameters changed inside an accumulation window without a
  //! step of a prepared optimizer (an optimizer accel did not prepare stepped them on local gradients: the replicas
  //! drift apart), and when the window's gradients were cleared (that optimizer's zero_grad).
  void backward(const at::Tensor& loss);

  // [accelerate:accelerator.py Accelerator.clip_grad_norm_]
  //! Unscales the gradients (fp16) then clips their total norm; returns the norm before clipping. Under fp16,
  //! call it on synchronising steps only (`sync_gradients()`): gradients are unscaled once per step.
  double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);
  //! `clip_grad_norm_` over a model's parameters (the prepared model's, or a module holder's).
  template <class M>
  requires ModuleHandle<M> || is_prepared_model<M>
  double clip_grad_norm_(const M& model, double max_norm, double norm_type = 2.0);
  // [accelerate:accelerator.py Accelerator.clip_grad_value_]
  //! Unscales the gradients (fp16) then clamps every gradient element into `[-clip_value, clip_value]`. Under
  //! fp16, call it on synchronising steps only (`sync_gradients()`), as `clip_grad_norm_`.
  void clip_grad_value_(const std::vector<at::Tensor>& parameters, double clip_value);
  //! `clip_grad_value_` over a model's parameters (the prepared model's, or a module holder's).
  template <class M>
  requires ModuleHandle<M> || is_prepared_model<M>
  void clip_grad_value_(const M& model, double clip_value);
  //! Divides every prepared optimizer's gradients by the loss scale (fp16; nothing otherwise).
  void unscale_gradients();

  //! RAII: the forward pass runs in `Options::mixed_precision` (bf16 or fp16 autocast on this process's
  //! device); disabled under `Precision::no`.
  [[nodiscard]] AutocastScope autocast() const;

  //! Gathers a batch's results from every process, dropping the padding of the current batch exactly
  //! (inside a prepared loader's loop; outside one it is a plain `gather`).
  //! Under uneven tails, a rank out of batches contributes no rows (Note [Joined steps]): every real sample
  //! is gathered exactly once.
  template <TensorStructure T>
  [[nodiscard]] T gather_for_metrics(const T& x) const;
  // [accelerate:accelerator.py Accelerator.gather_for_metrics]
  //! The same for objects (Accelerate's `use_gather_object` path, which it takes for non-tensor data): one
  //! element per sample of the batch, of any serialisable type (core/serialize.hpp); every rank gets the ranks'
  //! elements in rank order without the padding, exactly the samples the tensor form keeps for the same batch.
  //! Outside a prepared loader's loop it is every rank's elements, concatenated (Accelerate's `gather_object`).
  template <class T>
  requires(!TensorStructure<std::vector<T>>)
      [[nodiscard]] std::vector<T> gather_for_metrics(const std::vector<T>& x) const;
  //! Every rank's `x`, concatenated (shapes must agree: under uneven tails a rank out of batches contributes
  //! zeros of the shape it last gathered; use `gather_for_metrics` for a batch's rows).
  template <TensorStructure T>
  [[nodiscard]] T gather(const T& x) const;
  // [accelerate:accelerator.py Accelerator.reduce]
  //! The reduction of `x` over the processes, times `scale`: the sum by default, as Accelerate's
  //! `Accelerator.reduce` (the module function `accel::reduce` defaults to the mean, as Accelerate's). Under
  //! uneven tails a rank out of batches contributes the operation's identity (zero for sum and mean, as Join).
  template <TensorStructure T>
  [[nodiscard]] T reduce(const T& x, Reduction op = Reduction::sum, double scale = 1.0) const;

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
  [[nodiscard]] bool check_trigger();

  //! Whether this step synchronises gradients (the optimizer really steps).
  [[nodiscard]] bool sync_gradients() const { return GradientState::instance().sync_gradients(); }
  //! `Options::gradient_accumulation_steps`.
  [[nodiscard]] int gradient_accumulation_steps() const noexcept { return opt_.gradient_accumulation_steps; }
  //! How many times a scheduler prepared here steps over `epochs` passes of the prepared `loader` (or of that
  //! many batches per process): `accel::schedule_steps` with this job's processes, accumulation and batching
  //! (`batches::split`, or `Options::scheduler_steps_once`: once per optimizer step). For a scheduler stepped once
  //! per optimizer step (`step_scheduler_with_optimizer`, the default) with `sync_with_dataloader` (the default).
  template <class Loader>
  [[nodiscard]] std::int64_t schedule_steps(const Loader& loader, std::int64_t epochs) const {
    return accel::schedule_steps(loader, epochs, opt_.gradient_accumulation_steps, num_processes(),
                                 config::split_batches || opt_.scheduler_steps_once);
  }
  //! Accelerate's `Accelerator.step`: accumulation steps since the last reset.
  [[nodiscard]] std::int64_t step() const noexcept { return accumulation_.step(); }
  //! Whether any prepared optimizer skipped its last step (inf/NaN under fp16).
  [[nodiscard]] bool optimizer_step_was_skipped() const;
  //! The GradScaler under `Precision::fp16`; null otherwise.
  [[nodiscard]] GradScaler* scaler() const noexcept { return scaler_.get(); }
  //! The run-time settings this accelerator was built with.
  [[nodiscard]] const Options& options() const noexcept { return opt_; }

  // ---- processes -----------------------------------------------------------------------------------------

  //! This process's `ProcessState` (Accelerate's `PartialState`).
  [[nodiscard]] const ProcessState& state() const noexcept { return state_; }
  //! The communicator connecting the processes; null for one process.
  [[nodiscard]] comm::Communicator* comm() const noexcept { return state_.comm(); }
  //! This process's device (the GPU it uses, or the CPU).
  [[nodiscard]] const c10::Device& device() const noexcept { return state_.device(); }
  //! The number of processes of the job.
  [[nodiscard]] int num_processes() const noexcept { return state_.num_processes(); }
  //! This process's rank, in [0, `num_processes()`).
  [[nodiscard]] int process_index() const noexcept { return state_.process_index(); }
  //! Whether this is rank 0.
  [[nodiscard]] bool is_main_process() const noexcept { return state_.is_main_process(); }
  //! Whether this is the first process of its node.
  [[nodiscard]] bool is_local_main_process() const noexcept { return state_.is_local_main_process(); }
  //! This process's index on its node.
  [[nodiscard]] int local_process_index() const noexcept { return state_.local_process_index(); }
  //! Whether this is the last rank.
  [[nodiscard]] bool is_last_process() const noexcept { return state_.is_last_process(); }
  // [accelerate:accelerator.py Accelerator.on_main_process]
  //! Runs `f()` on the main process only; `bool` (whether it ran) for an `f` returning nothing, else
  //! `std::optional` of its result (`ProcessState::on_main_process`). The `on_*` helpers do not communicate.
  template <std::invocable F>
  OnProcessResult<F> on_main_process(F&& f) const {
    return state_.on_main_process(std::forward<F>(f));
  }
  // [accelerate:accelerator.py Accelerator.on_local_main_process]
  //! Runs `f()` on the main process of each node only.
  template <std::invocable F>
  OnProcessResult<F> on_local_main_process(F&& f) const {
    return state_.on_local_main_process(std::forward<F>(f));
  }
  // [accelerate:accelerator.py Accelerator.on_last_process]
  //! Runs `f()` on the last process only.
  template <std::invocable F>
  OnProcessResult<F> on_last_process(F&& f) const {
    return state_.on_last_process(std::forward<F>(f));
  }
  // [accelerate:accelerator.py Accelerator.on_process]
  //! Runs `f()` on the process `index` only (an index outside `[0, num_processes())` is an error).
  template <std::invocable F>
  OnProcessResult<F> on_process(int index, F&& f) const {
    return state_.on_process(index, std::forward<F>(f));
  }
  // [accelerate:accelerator.py Accelerator.on_local_process]
  //! Runs `f()` on the process of local index `local_index` of each node (outside `[0, local processes)`: an error).
  template <std::invocable F>
  OnProcessResult<F> on_local_process(int local_index, F&& f) const {
    return state_.on_local_process(local_index, std::forward<F>(f));
  }
  //! A barrier: returns once every process has reached it (Accelerate's `wait_for_everyone`).
  void wait_for_everyone() const { state_.wait_for_everyone(); }
  //! Accelerate's `main_process_first`: a guard under which the main process runs first, then the others (see
  //! `ProcessState::main_process_first`).
  [[nodiscard]] auto main_process_first() const { return state_.main_process_first(); }
  //! Prints the arguments on the local main process only (Accelerate's `print`).
  template <class... Args>
  void print(const Args&... args) const {
    state_.print(args...);
  }

  // ---- checkpoints (checkpoint/checkpointer.hpp; layout: checkpoint/format.hpp) ---------------------------------

  // [accelerate:accelerator.py Accelerator.save_state]
  //! Saves every prepared model, optimizer, scheduler and loader, the scaler, every process's generators, the
  //! step counter and the trackers' position (how many `log` calls, the last step) into `dir` (replaced whole once
  //! every process has written its part). Every process calls it.
  void save_state(const std::filesystem::path& dir);
  //! `save_state` under `ProjectConfiguration::automatic_checkpoint_naming`: into
  //! `<project_dir>/checkpoints/checkpoint_<iteration>` (an existing one is an error: nothing is overwritten);
  //! once it is complete, the oldest complete checkpoints beyond `total_limit` are removed and `iteration`
  //! grows by one. Returns the checkpoint's directory. Every process calls it.
  std::filesystem::path save_state();

  // [accelerate:accelerator.py Accelerator.load_state]
  //! Restores what `save_state` wrote into the objects prepared (in the same order) by this job. Every
  //! process calls it; the next batch of each loader is the one after the checkpoint. The checkpoint may come from
  //! a job of another number of processes (README, "Resuming at another world size"): the interrupted epoch goes on
  //! over exactly the samples that job had not consumed; a rank it did not have takes rank 0's generators; one
  //! saved inside an accumulation window resumes only with its own number of processes. Under automatic naming,
  //! the next `save_state()` numbers after the project's latest checkpoint.
  //! Refuses, naming both values, a checkpoint saved under another `mixed_precision` or
  //! `gradient_accumulation_steps` unless `options.allow_changed_settings` (README, "What load_state checks").
  void load_state(const std::filesystem::path& dir, const LoadOptions& options = {});
  //! `load_state` of the project's latest complete checkpoint (automatic naming; a checkpoint being written is
  //! never chosen). Returns its directory. Every process calls it.
  std::filesystem::path load_state(const LoadOptions& options = {});
  //! The project's latest complete checkpoint, if any, as the main process sees it (every process calls it,
  //! so that all take the same decision, e.g. whether to `load_state()`).
  [[nodiscard]] std::optional<std::filesystem::path> latest_checkpoint() const;

  // [accelerate:accelerator.py Accelerator.register_for_checkpointing]
  //! Adds objects to what `save_state` saves and `load_state` restores, after the prepared ones, in the order
  //! of registration: anything with `save(OutputArchive&) const` / `load(InputArchive&)` (a module, an
  //! optimizer), with `state_dict()` / `load_state_dict(s)` of a serialisable state, or itself serialisable (a
  //! counter, a struct with `accel_fields`); see checkpoint/custom.hpp. Pass a `std::shared_ptr` (kept alive)
  //! or an lvalue that outlives every `save_state` / `load_state`. The main process writes them; every process
  //! restores them. Loading with other objects registered (count or types) is an error naming them.
  template <class... Objects>
  void register_for_checkpointing(Objects&&... objects);
  // [accelerate:accelerator.py Accelerator.register_save_state_pre_hook]
  //! Adds `hook`, which every `save_state` (the preemption save included) calls first, on every process, with the
  //! checkpoint's directory; hooks run in the order of registration. The place to bring into a registered object what
  //! only all processes together know, such as every process's running sums (a collective is safe there: every
  //! process saves at the same point). Accelerate's hook also receives the models and their state dicts, to change
  //! what is written; here the registered objects are what is written.
  void register_save_state_pre_hook(std::function<void(const std::filesystem::path&)> hook);

  // [accelerate:accelerator.py Accelerator.save_model]
  //! Writes the (unwrapped) model's parameters and buffers as safetensors into `dir`: `model.safetensors`, or
  //! above `max_shard_size` shards and `model.safetensors.index.json`, named and split as Accelerate does
  //! (checkpoint/safetensors.hpp). Every process calls it; the main process writes, the others wait for it, and
  //! a failure there is raised on every process.
  template <class M>
  requires ModuleHandle<M> || is_prepared_model<M>
  void save_model(const M& model, const std::filesystem::path& dir, const checkpoint::SaveModelOptions& options = {});

  // [accelerate:accelerator.py Accelerator.get_state_dict]
  //! The model's parameters and buffers by name, in `named_parameters()` then `named_buffers()` order (what
  //! `checkpoint::save_safetensors_sharded` writes). Under `accel::shard::parameters` it is collective (every process
  //! calls it): the units are gathered one at a time (at most one unit's whole parameters extra on each process) and
  //! the main process alone receives the full state, copied in the shards' dtype; the others get none, as
  //! Accelerate's FSDP path (full state dict, rank 0 only). Otherwise each process gets its own model's tensors,
  //! detached (not copied).
  template <class M>
  requires ModuleHandle<M> || is_prepared_model<M>
  [[nodiscard]] checkpoint::NamedTensors get_state_dict(const M& model) {
    const auto module = module_of(unwrap_model(model));
    checkpoint::NamedTensors out;
    const auto d = distributed_of(model);
    if (!d || !d->sharder()) {
      for (const auto& p : module->named_parameters()) out.emplace_back(p.key(), p.value().detach());
      for (const auto& b : module->named_buffers()) out.emplace_back(b.key(), b.value().detach());
      return out;
    }
    const bool main = is_main_process();
    std::unordered_map<std::string, at::Tensor> whole;
    // not a step call: a full state dict is every process's call between steps
    d->sharder()->for_each_unit_whole([&](const UnitSharder::Unit& unit, const at::Tensor& flat) {
      if (!main) return;
      for (const auto& p : unit.params)
        whole[p.name] = flat.narrow(0, p.offset, p.numel).view(p.tensor.sizes()).clone();
    });
    if (!main) return out;
    for (const auto& p : module->named_parameters()) out.emplace_back(p.key(), whole.at(p.key()));
    for (const auto& b : module->named_buffers()) out.emplace_back(b.key(), b.value().detach().clone());
    return out;
  }

  //! Under `accel::shard::parameters`: every unit of `model` gathered while the result lives, so its parameters
  //! read as the whole model (FSDP's `summon_full_params`). Collective: every process opens it, at the same point.
  //! `write_back`: what is written into the parameters inside goes back into each process's shards at its end
  //! (otherwise it is dropped). Without full sharding every process holds the whole model: nothing to gather.
  template <class M>
  requires ModuleHandle<M> || is_prepared_model<M>
  [[nodiscard]] GatheredParameters gather_parameters(const M& model, bool write_back = false) {
    std::vector<std::shared_ptr<UnitSharder>> sharders;
    if (const auto d = distributed_of(model); d && d->sharder()) sharders.push_back(d->sharder());
    return {std::move(sharders), write_back};
  }

  // ---- experiment trackers (tracking/trackers.hpp) ------------------------------------------------------------

  // [accelerate:accelerator.py Accelerator.init_trackers]
  //! Starts the trackers of `Options::log_with` for the run `project_name` with its hyperparameters `config`:
  //! on the main process only (the others write nothing), into `<logging_dir()>/<project_name>/`. After a
  //! `load_state` the run's files are continued from the checkpoint: what the stopped job logged after it is
  //! dropped (JSONL and CSV rows, TensorBoard steps past the checkpoint's last), so that the resumed run's files
  //! end as an uninterrupted run's (tracking/trackers.hpp); otherwise they are started anew. Every process calls it.
  void init_trackers(const std::string& project_name, const tracking::Values& config = {});
  // [accelerate:accelerator.py Accelerator.log]
  //! Logs one step's values to every tracker (main process only; elsewhere only counted). Without `step`, the
  //! step is the number of `log` calls before this one (in a resumed job, the checkpoint's count included).
  void log(const tracking::Values& values, std::optional<std::int64_t> step = std::nullopt);
  // [accelerate:accelerator.py Accelerator.end_training]
  //! Closes the trackers' files, then waits for every process (so that all may read them afterwards).
  void end_training();
  //! Where trackers write: `Options::logging_dir`, else the project's `logging_dir`, else its `project_dir`.
  [[nodiscard]] std::filesystem::path logging_dir() const;

 private:
  using Ddps = std::vector<std::shared_ptr<DistributedModule>>;

  //! What a rank out of batches repeats of `accumulate` (Note [Joined steps]).
  GradientState::StepCall repeat_accumulate(Ddps ddps);
  SyncScope no_sync_of(const Ddps& ddps);
  //! `gather_for_metrics` inside a loader's loop, for tensors and objects alike; `none` makes this rank's
  //! contribution to a step it lacks (no rows).
  template <class T, class None>
  T gather_batch(const T& x, None none) const;
  //! The rows of several gathers of one structure, concatenated tensor by tensor.
  template <TensorStructure T>
  static T concat_rows(const std::vector<T>& parts);
  //! The elements of several gathers of objects, concatenated.
  template <class U>
  requires(!TensorStructure<std::vector<U>>) static std::vector<U> concat_rows(std::vector<std::vector<U>> parts);
  //! A collective in an epoch where some rank has no batch at all: that rank has no step to repeat, so the
  //! collective could never be matched; every rank knows it from the plan and stops here, with the same error.
  void refuse_starved(const char* what) const;
  //! What a rank without a batch contributes to a reduction: zero for sum and mean, the dtype's lowest value for
  //! max and its highest for min.
  static at::Tensor identity_like(const at::Tensor& t, Reduction op);

  struct OptimizerEntry {
    std::shared_ptr<torch::optim::Optimizer> optimizer;
    std::shared_ptr<const StepRecord> record;
    std::shared_ptr<ShardedOptimizer> sharded;  // ZeRO stage 1's partition (nullptr: not sharded)
  };
  [[nodiscard]] checkpoint::Checkpointer::Process checkpoint_process() const;
  //! `load_state(dir)`; `latest`: the project's latest checkpoint number under automatic naming (the next
  //! `save_state()` numbers after it).
  void restore(const std::filesystem::path& dir, std::optional<std::int64_t> latest, const LoadOptions& options);
  //! The training settings a checkpoint records and `load_state` compares (checkpoint::Settings).
  [[nodiscard]] checkpoint::Settings settings() const;
  //! The largest number of synchronising steps any prepared optimizer has taken in this process.
  [[nodiscard]] std::uint64_t optimizer_steps() const;
  //! Every prepared model's trainable parameters, named ("model 1: fc.weight" when there are several models).
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> replica_parameters() const;
  //! The checks of `backward` (its documentation): warnings, once each, on the main process.
  void check_before_backward();
  //! The misuses `check_before_backward` warns of.
  enum class Warning : unsigned { backward_outside_accumulate, stepped_outside_accel, cleared_in_window };
  //! Prints `message` once per `which` on the main process.
  void warn_once(Warning which, const std::string& message);
  //! The trackers' files closed (end_training, preemption).
  void stop_tracking();
  //! `v` reduced over the processes (a flag: set_trigger's, a preemption signal).
  [[nodiscard]] std::int64_t reduce_flag(std::int64_t v, Reduction op) const;
  //! Runs `check` on the main process (the project folder as it sees it) and raises its error on every process.
  template <class Check>
  void agree_on_main(const char* what, Check&& check) const;
  //! The number of the project's latest complete checkpoint, as the main process sees it (a collective).
  [[nodiscard]] std::optional<std::int64_t> latest_checkpoint_number() const;
  template <class T>
  void register_one(T&& object);
  //! Points GradientState's step boundary hook at this accelerator (under `Options::preemption`): at
  //! construction, and again wherever the loop passes after the accelerator was moved (a moved-from one clears
  //! its own hook when it goes).
  void bind_boundary_hook();
  //! `Options::preemption` at a step boundary (GradientState's hook): after an optimizer step, every process
  //! learns whether any was signalled; if so all save and stop together.
  void at_step_boundary();

  template <class T>
  auto first_pass(T&& x);
  template <class T>
  auto second_pass(T&& x);
  template <class Loader>
  Loader register_loader(Loader l);

  // ZeRO stage 2: each prepared model's gradients go to the partitions of the sharded optimizer that holds its
  // parameters (models prepared before their optimizer are bound when it is prepared).
  void shard_gradients();
  // ZeRO stage 2: this rank's part of the partitioned gradients of `parameters`, and the whole gradients of the
  // others (parameters of no sharded optimizer).
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> gradients_of(
      const std::vector<at::Tensor>& parameters) const;
  void check_optimizer_parameters(std::size_t first) const;
  template <class M>
  static std::shared_ptr<DistributedModule> distributed_of(const M& m);

  Options opt_;
  ProcessState state_;
  Accumulation accumulation_;
  std::shared_ptr<GradScaler> scaler_;
  std::vector<OptimizerEntry> optimizers_;
  Ddps ddps_;                              // every prepared model's gradient synchroniser
  checkpoint::Checkpointer checkpointer_;  // every prepared object, in prepare order
  std::vector<std::function<void(const std::filesystem::path&)>> save_hooks_;  // register_save_state_pre_hook's
  tracking::Trackers trackers_;       // the run's writers (none but on the main process) and position
  bool trackers_started_ = false;     // init_trackers was called (on every process)
  detail::SignalWatch signals_;       // Options::preemption's signals, while this accelerator lives
  std::uint64_t boundary_steps_ = 0;  // optimizer steps at the last step boundary
  bool resumed_ = false;              // load_state was called: init_trackers continues the run's files from
                                      // trackers_'s position (the checkpoint's)
  std::uint64_t training_steps_ = 0;  // synchronising steps with a backward, counted at step boundaries
  std::uint64_t backwards_ = 0, backwards_at_boundary_ = 0;  // backward() calls: in all, at the last step boundary
  std::uint64_t replicas_agreed_ = 0;                        // training_steps_ at the last replica check that passed
  bool accumulating_ = false;            // accumulate() decided the step that the next backward runs
  std::uint64_t steps_at_backward_ = 0;  // optimizer steps at the last backward (parameter changes since)
  unsigned warned_ = 0;                  // warn_once's bits, one per Warning
  std::int64_t trigger_ = 0;             // set_trigger's flag, until check_trigger finds it
};

}  // namespace accel

#include <accel/accelerator/checkpoints.hpp>
#include <accel/accelerator/loop.hpp>
#include <accel/accelerator/prepare.hpp>
