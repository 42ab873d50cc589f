#pragma once
//! \file
//! `Accelerator::prepare` (accelerator.hpp): what it makes of each argument (`detail::classify`), its two passes,
//! the loaders' registration, ZeRO's gradient partitions and the check of the optimizers' parameters. Included by
//! accelerator.hpp.

#include <accel/accelerator.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

namespace accel {

namespace detail {
template <class T>
inline constexpr bool is_data_loader = false;
template <class D, class C>
inline constexpr bool is_data_loader<data::DataLoader<D, C>> = true;

//! What `prepare` makes of an argument.
enum class Prepares { model, optimizer, scheduler, loader, optimizer_lvalue, unknown };
template <class A>
consteval Prepares classify() {
  using T = std::remove_cvref_t<A>;
  if constexpr (ModuleHandle<T>)
    return Prepares::model;
  else if constexpr (TorchOptimizer<shared_t<T>>)
    return Prepares::optimizer;
  else if constexpr (TorchOptimizer<T>)
    return std::is_rvalue_reference_v<A&&> && !std::is_const_v<std::remove_reference_t<A>> ? Prepares::optimizer
                                                                                           : Prepares::optimizer_lvalue;
  else if constexpr (TorchScheduler<shared_t<T>>)
    return Prepares::scheduler;
  else if constexpr (is_data_loader<T>)
    return Prepares::loader;
  else
    return Prepares::unknown;
}

//! A scheduler between the two passes of `prepare` (it is linked to the optimizers once all are prepared).
template <class S>
struct PendingScheduler {
  std::shared_ptr<S> scheduler;
};
struct NotPrepared {};

}  // namespace detail

template <class... Policies>
template <class... Ts>
auto Accelerator<Policies...>::prepare(Ts&&... objects) {
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
  for (std::size_t i = first_new_optimizer; i < optimizers_.size(); ++i) {
    if (!optimizers_[i].sharded) continue;
    if constexpr (config::zero_stage == 3)
      optimizers_[i].sharded->build_over([this](const at::Tensor& p) -> const UnitSharder::Piece* {
        for (const auto& d : ddps_)
          if (const auto& s = d->sharder())
            if (const auto* piece = s->piece_of(p)) return piece;
        return nullptr;
      });
    optimizers_[i].sharded->build();
  }
  if constexpr (config::zero_stage == 2) shard_gradients();
  auto out = std::apply(
      [this](auto&... r) { return std::tuple<decltype(second_pass(std::move(r)))...>{second_pass(std::move(r))...}; },
      first);
  if constexpr (sizeof...(Ts) == 1)
    return std::get<0>(std::move(out));
  else
    return out;
}

template <class... Policies>
template <class Dataset, class Collate, class Slice>
auto Accelerator<Policies...>::prepare_data_loader(const data::DataLoader<Dataset, Collate>& loader, Slice slice) {
  return register_loader(data::prepare_data_loader<config>(loader, state_, std::move(slice)));
}

template <class... Policies>
template <class T>
auto Accelerator<Policies...>::first_pass(T&& x) {
  using U = std::remove_cvref_t<T>;
  constexpr auto kind = detail::classify<T>();
  if constexpr (kind == detail::Prepares::model) {
    auto module = module_of(x);
    if constexpr (config::device_placement) {
      if constexpr (config::zero_stage == 3 && !one_process) {
        // Full sharding moves the parameters unit by unit as it shards them (Note [Sharding onto the device unit by
        // unit]): a model that does not fit the device whole still gets there. Its buffers go now.
        torch::NoGradGuard no_grad;
        for (auto& b : module->buffers())
          if (b.defined() && b.device() != device()) b.set_data(b.to(device()));
      } else {
        module->to(device());
      }
    }
    // not a step call: prepare hands the communicator to the model's collective modules
    const std::size_t collective =
        set_communicators(*module, state_.comm());  // its SyncBatchNorms use this job's processes
    // A rank out of batches under uneven tails repeats the others' gradient collectives, not a forward's batch
    // statistics (PyTorch's join does not support SyncBatchNorm either): refused here rather than hung later.
    if constexpr (!config::even_batches && !one_process)
      detail::require(
          collective == 0 || num_processes() == 1,
          "accel::Accelerator::prepare: the model holds " + std::to_string(collective) +
              " SyncBatchNorm (or other "
              "module that communicates in its forward); under accel::tail::uneven a rank out of batches cannot "
              "take part in the others' batch statistics: use accel::tail::even (the default), or BatchNorm");
    if constexpr (one_process) {
      checkpointer_.add_model(module);
      return U(std::forward<T>(x));
    } else {
      auto ddp = std::make_shared<DistributedModule>(
          // not a step call: prepare builds the model's synchroniser (its collectives go through the door)
          module, state_.comm(),
          DistributedOptions{.bucket_bytes = opt_.bucket_bytes,
                             .find_unused_parameters = opt_.find_unused_parameters,
                             .broadcast_buffers = opt_.broadcast_buffers,
                             .comm_hook = opt_.comm_hook,
                             .broadcast_parameters = config::zero_stage != 3});
      // not a step call: prepare shards the model's parameters by unit (its gathers go through the door)
      if constexpr (config::zero_stage == 3) {
        ddp->shard_parameters(opt_.sharding,
                              config::device_placement ? std::optional<c10::Device>(device()) : std::nullopt);
        checkpointer_.add_model(module, checkpoint::sharded_model(ddp->sharder()));
      } else {
        checkpointer_.add_model(module);
      }
      ddps_.push_back(ddp);
      return PreparedModel<U>(std::forward<T>(x), std::move(ddp));
    }
  } else if constexpr (kind == detail::Prepares::optimizer) {
    using O = std::conditional_t<TorchOptimizer<U>, U, detail::shared_t<U>>;
    std::shared_ptr<O> p;
    if constexpr (TorchOptimizer<U>)
      p = std::make_shared<O>(std::move(x));
    else
      p = x;
    AcceleratedOptimizer<O> wrapped(p, scaler_);
    std::shared_ptr<ShardedOptimizer> sharded;
    if constexpr (config::zero_stage > 0 && !one_process) {
      static_assert(
          ShardableOptimizer<O> || std::is_same_v<O, torch::optim::Optimizer>,
          "accel::shard::optimizer shards optimizers whose state is per parameter and whose update is "
          "elementwise (torch::optim::SGD, Adam, AdamW, RMSprop, Adagrad), and so does accel::shard::gradients; "
          "this optimizer (LBFGS, or one of "
          "your own) is not known to be: use accel::shard::none, or specialise accel::ShardTraits for it");
      if constexpr (ShardableOptimizer<O>) {
        // not a step call: prepare builds the sharded optimizer (its step goes through the door)
        sharded = std::make_shared<ShardedOptimizer>(p, state_.comm(), config::zero_stage);
        wrapped.set_sharded(sharded);
      } else if constexpr (std::is_same_v<O, torch::optim::Optimizer>) {
        // not a step call: prepare builds the sharded optimizer of one chosen at run time (by its dynamic type, or
        // refused naming it); its step goes through the door
        sharded = make_sharded_optimizer(p, state_.comm(), config::zero_stage);
        wrapped.set_sharded(sharded);
      }
    }
    checkpointer_.add_optimizer({[wrapped](auto& a) { wrapped.save(a); },
                                 [wrapped](auto& a) mutable { wrapped.load(a); },
                                 [wrapped](auto& a) { wrapped.check(a); }});
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

template <class... Policies>
template <class T>
auto Accelerator<Policies...>::second_pass(T&& x) {
  if constexpr (requires { x.scheduler; }) {
    using S = typename std::remove_cvref_t<decltype(*x.scheduler)>;
    std::vector<std::shared_ptr<const StepRecord>> records;
    for (const auto& o : optimizers_) records.push_back(o.record);
    AcceleratedScheduler<S> wrapped(std::move(x.scheduler), std::move(records),
                                    {.num_processes = num_processes(),
                                     .split_batches = config::split_batches,
                                     .step_with_optimizer = opt_.step_scheduler_with_optimizer,
                                     .always_once = opt_.scheduler_steps_once});
    checkpointer_.add_scheduler({[wrapped](auto& a) { wrapped.save(a); },
                                 [wrapped](auto& a) mutable { wrapped.load(a); },
                                 [wrapped](auto& a) { wrapped.check(a); }});
    return wrapped;
  } else {
    return std::forward<T>(x);
  }
}

template <class... Policies>
template <class Loader>
Loader Accelerator<Policies...>::register_loader(Loader l) {
  checkpointer_.add_loader(
      {[l] { return l.state_dict(); },
       [l](const data::LoaderState& s) mutable { l.load_state_dict(s, data::GlobalGenerator::restored_by_caller); },
       [l](const data::LoaderState& s) { return l.state_mismatch(s); },
       [l](const data::LoaderState& s) { return l.state_unreachable(s); }});
  return l;
}

template <class... Policies>
void Accelerator<Policies...>::shard_gradients() {
  for (const auto& d : ddps_) {
    if (d->shards_gradients()) continue;
    const void* first = nullptr;
    for (const auto& p : d->module().parameters())
      if (p.requires_grad()) {
        first = p.unsafeGetTensorImpl();
        break;
      }
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

template <class... Policies>
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> Accelerator<Policies...>::gradients_of(
    const std::vector<at::Tensor>& parameters) const {
  std::vector<at::Tensor> parts, whole;
  std::unordered_set<const void*> covered;
  for (const auto& o : optimizers_)
    if (o.sharded)
      for (auto& g : o.sharded->owned_gradients(parameters, covered)) parts.push_back(std::move(g));
  for (const auto& p : parameters)
    if (!covered.count(p.unsafeGetTensorImpl()) && p.grad().defined()) whole.push_back(p.grad());
  return {std::move(parts), std::move(whole)};
}

template <class... Policies>
void Accelerator<Policies...>::check_optimizer_parameters(std::size_t first) const {
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
        throw InvalidArgument("accel::Accelerator::prepare: optimizer #" + std::to_string(i) +
                              " holds a parameter (group " + std::to_string(g) + ", index " + std::to_string(k) +
                              ", shape [" + shape +
                              "]) that belongs to no prepared model; build the optimizer from the prepared model's "
                              "parameters(), and prepare that model too");
      }
  }
}

}  // namespace accel
