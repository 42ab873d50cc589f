#pragma once
//! \file
//! The definitions of `UnitSharder`'s members (model/unit_sharder.hpp, included at its end): the operator callback
//! and its registry need the dispatcher's RecordFunction, which stays out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/model/unit_sharder.hpp>

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/serialize/archive.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace accel {

namespace detail {

// The storages of every sharded unit in the process, for the operator callback: storage -> (sharder, unit).
struct ShardedStorages {
  std::mutex mu;
  std::unordered_map<const c10::StorageImpl*, std::pair<std::weak_ptr<UnitSharder>, std::size_t>> map;
  std::atomic<std::size_t> size{0};
  static ShardedStorages& instance() {
    static ShardedStorages* r = new ShardedStorages;  // never destroyed: the callback may run during exit
    return *r;
  }
};

// RecordFunction's inputs without its debug-build assertion (which reads a flag only a debug build of LibTorch
// sets): the standard's rule that an explicit instantiation may name a private member gives read access.
c10::ArrayRef<const c10::IValue> record_function_inputs(const at::RecordFunction& f);
template <c10::ArrayRef<const c10::IValue> at::RecordFunction::*Member>
struct RecordFunctionInputs {
  friend c10::ArrayRef<const c10::IValue> record_function_inputs(const at::RecordFunction& f) { return f.*Member; }
};
template struct RecordFunctionInputs<&at::RecordFunction::inputs_>;

inline thread_local bool in_sharding_callback = false;

inline void collect_units(const c10::IValue& v, ShardedStorages& reg,
                          std::vector<std::pair<std::shared_ptr<UnitSharder>, std::size_t>>& out) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return;
    const auto it = reg.map.find(t.storage().unsafeGetStorageImpl());
    if (it == reg.map.end()) return;
    if (auto s = it->second.first.lock()) out.emplace_back(std::move(s), it->second.second);
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) collect_units(c10::IValue(at::Tensor(t)), reg, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) collect_units(e, reg, out);
  }
}

// The thread-local RecordFunction start callback (Note [Intercepting a unit without module hooks]).
inline std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn) {
  auto& reg = ShardedStorages::instance();
  if (reg.size.load(std::memory_order_relaxed) == 0 || in_sharding_callback) return nullptr;
  const auto inputs = record_function_inputs(fn);
  if (inputs.empty()) return nullptr;
  std::vector<std::pair<std::shared_ptr<UnitSharder>, std::size_t>> hits;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (const auto& v : inputs) collect_units(v, reg, hits);
  }
  if (hits.empty()) return nullptr;
  in_sharding_callback = true;
  struct Reset {
    ~Reset() { in_sharding_callback = false; }
  } reset;
  std::sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) {
    return a.first.get() != b.first.get() ? a.first.get() < b.first.get() : a.second < b.second;
  });
  for (std::size_t i = 0; i < hits.size();) {
    std::vector<std::size_t> units;
    std::size_t j = i;
    for (; j < hits.size() && hits[j].first == hits[i].first; ++j)
      if (units.empty() || units.back() != hits[j].second) units.push_back(hits[j].second);
    hits[i].first->touch(units);
    i = j;
  }
  return nullptr;
}

inline void watch_on_this_thread() {
  static thread_local bool added = false;
  if (added) return;
  at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_operator).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  added = true;
}

}  // namespace detail

ACCEL_DECL UnitSharder::UnitSharder(torch::nn::Module& root, comm::Communicator* comm, ShardingOptions options,
                                    const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                                    std::optional<c10::Device> device)
    : root_(&root), comm_(comm), options_(std::move(options)) {
  const auto names = plan_units(root, options_);
  units_.resize(names.size() + 1);
  for (std::size_t u = 0; u < names.size(); ++u) units_[u + 1].name = names[u];
  // Each parameter's innermost unit (the longest unit name that is a module prefix of the parameter's name).
  auto owner = [&](const std::string& param) {
    std::size_t best = 0, len = 0;
    for (std::size_t u = 1; u < units_.size(); ++u) {
      const auto& n = units_[u].name;
      if (n.size() >= len && param.size() > n.size() && param.compare(0, n.size(), n) == 0 && param[n.size()] == '.')
        best = u, len = n.size();
    }
    return best;
  };
  auto unit_label = [&](std::size_t u) {
    return u == 0 ? std::string("the root unit") : "unit '" + units_[u].name + "'";
  };
  std::unordered_map<const void*, std::pair<std::size_t, std::string>> seen;  // TensorImpl -> (unit, first name)
  std::unordered_map<const void*, int> trainable_index;
  for (std::size_t k = 0; k < trainable.size(); ++k)
    trainable_index.emplace(trainable[k].second.unsafeGetTensorImpl(), int(k));
  for (const auto& item : root.named_parameters()) {
    const at::Tensor& p = item.value();
    const std::size_t u = owner(item.key());
    const auto [it, first] = seen.emplace(p.unsafeGetTensorImpl(), std::make_pair(u, item.key()));
    if (!first) {
      if (it->second.first != u)
        throw InvalidArgument("accel::shard::parameters: parameter '" + it->second.second + "' (also '" + item.key() +
                              "') is in two units, " + unit_label(it->second.first) + " and " + unit_label(u) +
                              "; a unit's parameters are gathered and freed together: make a module that holds both "
                              "uses the unit (or leave them in the root unit)");
      continue;  // tied: one parameter under two names
    }
    auto& unit = units_[u];
    const auto t = trainable_index.find(p.unsafeGetTensorImpl());
    const int index = t == trainable_index.end() ? -1 : t->second;
    if (!unit.params.empty()) {
      const auto& f = unit.params.front();
      if ((f.trainable >= 0) != (index >= 0))
        throw InvalidArgument("accel::shard::parameters: " + unit_label(u) +
                              " mixes frozen and trainable parameters ('" + (f.trainable >= 0 ? item.key() : f.name) +
                              "' is frozen, '" + (f.trainable >= 0 ? f.name : item.key()) +
                              "' is not), as FSDP refuses them in one flat parameter; make the frozen submodules "
                              "units of their own, or freeze the whole unit");
      if (f.tensor.scalar_type() != p.scalar_type() || f.tensor.device() != p.device())
        throw InvalidArgument("accel::shard::parameters: " + unit_label(u) +
                              " holds parameters of different dtypes "
                              "or devices ('" +
                              f.name + "' and '" + item.key() +
                              "'); a unit is one flat buffer: make them units of their own");
    }
    unit.params.push_back({item.key(), p, unit.total, p.numel(), index});
    unit.total += p.numel();
    if (index >= 0) ++unit.trainables;
  }
  for (std::size_t u = 1; u < units_.size(); ++u)
    if (units_[u].params.empty())
      throw InvalidArgument("accel::shard::parameters: unit '" + units_[u].name +
                            "' holds no parameter of its own (its units hold them all, or it has none); name units "
                            "that own parameters");
  const int n = processes(), r = rank();
  unit_of_trainable_.assign(trainable.size(), 0);
  c10::AutoGradMode no_grad(false);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    auto& unit = units_[u];
    if (unit.params.empty()) continue;  // a root unit with nothing of its own
    unit.part = (unit.total + n - 1) / n;
    // On the device, one unit at a time (Note [Sharding onto the device unit by unit]).
    const auto& first = unit.params.front().tensor;
    const auto options = first.options().device(device.value_or(first.device())).requires_grad(false);
    // Under mp_policy a floating unit computes in param_dtype: its full buffer (and so its parameters) in that
    // dtype, its shard in the model's.
    const auto compute = options_.mp_policy.param_dtype && at::isFloatingType(options.dtype().toScalarType())
                             ? *options_.mp_policy.param_dtype
                             : options.dtype().toScalarType();
    at::Tensor whole = at::zeros({unit.part * n}, options);
    for (auto& p : unit.params) {
      whole.narrow(0, p.offset, p.numel).copy_(p.tensor.detach().reshape({-1}));
      if (p.trainable >= 0) unit_of_trainable_[std::size_t(p.trainable)] = u;
    }
    if (n > 1) comm_->broadcast(whole, 0);  // every process starts from rank 0's values
    unit.shard = whole.narrow(0, std::int64_t(r) * unit.part, unit.part).clone();
    unit.full = compute == whole.scalar_type() ? whole : whole.to(compute);
    // The gradients come in the reduce dtype (FSDP's unsharded gradient dtype): a compute-dtype gradient is cast up
    // as autograd accumulates it, so micro-batches accumulate in it too.
    const auto reduce =
        options_.mp_policy.reduce_dtype && at::isFloatingType(compute) ? *options_.mp_policy.reduce_dtype : compute;
    for (auto& p : unit.params) {
      bind(unit.full, p);
      if (p.trainable >= 0 && reduce != compute) p.tensor.set_grad_dtype(reduce);
    }
    if (unit.trainable()) unit.grad = at::zeros({unit.part}, options);
    // This rank's piece of each parameter, as aliases (not autograd views: an optimizer's parameter is a leaf).
    const std::int64_t lo = std::int64_t(r) * unit.part, hi = lo + unit.part;
    for (const auto& p : unit.params) {
      Piece piece;
      piece.unit_total = unit.total, piece.offset = p.offset;
      const std::int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      if (a < b) {
        piece.shard = detail::alias_of(unit.shard, a - lo, {b - a});
        if (unit.grad.defined()) piece.grad = detail::alias_of(unit.grad, a - lo, {b - a});
        piece.at = a - p.offset, piece.numel = b - a;
      }
      pieces_.emplace(p.tensor.unsafeGetTensorImpl(), std::move(piece));
    }
    unit.gathered = true;
    gathered_bytes_ += full_bytes(unit);
    free(unit);
  }
  peak_bytes_ = 0;
}

ACCEL_DECL void UnitSharder::unwatch() noexcept {
  auto& reg = detail::ShardedStorages::instance();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const auto& u : units_) {
    if (!u.full.defined() || !reg.map.erase(u.full.storage().unsafeGetStorageImpl())) continue;
    reg.size.fetch_sub(1, std::memory_order_relaxed);
  }
}

ACCEL_DECL void UnitSharder::watch() {
  detail::watch_on_this_thread();
  auto& reg = detail::ShardedStorages::instance();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (watching_) return;
  watching_ = true;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].full.defined()) continue;
    reg.map[units_[u].full.storage().unsafeGetStorageImpl()] = {weak_from_this(), u};
    reg.size.fetch_add(1, std::memory_order_relaxed);
  }
}

ACCEL_DECL void UnitSharder::before_forward() {
  detail::watch_on_this_thread();
  std::lock_guard<std::mutex> lock(mu_);
  in_forward_ = true;
  recording_.clear();
  // A parameter given other memory since (`p.set_data(...)` after prepare) would have the forward read it while the
  // optimizer steps the shards: its values are taken in first.
  for (auto& u : units_)
    for (auto& p : u.params)
      if (moved(u, p)) adopt_moved(u, p);
}

ACCEL_DECL void UnitSharder::adopt_moved(Unit& u, Param& p) {
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  const at::Tensor values = p.tensor.detach().reshape({-1});
  const std::int64_t r = rank(), lo = std::max(p.offset, r * u.part),
                     hi = std::min(p.offset + p.numel, (r + 1) * u.part);
  if (lo < hi) u.shard.narrow(0, lo - r * u.part, hi - lo).copy_(values.narrow(0, lo - p.offset, hi - lo));
  if (u.gathered) u.full.narrow(0, p.offset, p.numel).copy_(values);
  bind(u.full, p);
}

ACCEL_DECL void UnitSharder::bind(const at::Tensor& buffer, Param& p) {
  if (p.tensor.scalar_type() == buffer.scalar_type() && p.tensor.device() == buffer.device())
    detail::rebind_to(p.tensor, buffer, p.offset);
  else  // mp_policy, or moved to the device: the parameter takes the buffer's dtype and device (its TensorImpl, hooks
        // and gradient slot kept)
    p.tensor.set_data(detail::alias_of(buffer, p.offset, p.tensor.sizes()));
}

ACCEL_DECL void UnitSharder::all_gather(Unit& u, at::Tensor& into) {
  // Under mp_policy the shard is cast before the all-gather: param_dtype's bytes travel (FSDP's order).
  const at::Tensor part = u.shard.to(into.scalar_type());  // the shard itself when the dtypes agree
  if (processes() > 1)
    comm_->all_gather_into(into, part);
  else
    into.copy_(part);
}

ACCEL_DECL void UnitSharder::touch(const std::vector<std::size_t>& touched) {
  std::lock_guard<std::mutex> lock(mu_);
  bool missing = false;
  for (auto u : touched) missing = missing || !units_[u].gathered || u == inflight_;
  if (!missing) return;
  // A second backward through a retained graph (retain_graph = true; the first one's end disarmed gathering and freed
  // every unit): armed again, as FSDP2 gathers each unit again; its gradients accumulate onto the first's.
  if (!in_forward_ && !backward_due_ && !gathering_all_ && torch::autograd::get_current_graph_task_id() != -1) {
    backward_due_ = true;
    rearmed_ = true;
    // Its end: where a parameter's gradient accumulated, the prepared model's end of backward (queued by the
    // gradient's hook, after this) reduces and resets; where none did (`torch::autograd::grad` with respect to the
    // inputs), this one frees the units and disarms.
    std::weak_ptr<UnitSharder> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) {
        std::lock_guard<std::mutex> lock(self->mu_);
        if (self->rearmed_) self->reset();
      }
    });
  }
  if (!in_forward_ && !backward_due_ && !gathering_all_) {
    std::string names;
    for (auto u : touched)
      if (!units_[u].gathered)
        names += (names.empty() ? "" : ", ") + (u == 0 ? std::string("the root unit") : "'" + units_[u].name + "'");
    // The operator's kernel would read freed memory next, and the dispatcher swallows a callback's exception:
    // stop here, saying why, rather than crash on it.
    std::fprintf(stderr,
                 "accel: error: accel::shard::parameters: an operator read the parameters of %s, which are sharded "
                 "(each process holds 1/N of them), outside a forward through the prepared model and its backward; "
                 "call the prepared model itself, model(x), not model->forward(x), and read (or load) full parameters "
                 "inside `auto full = acc.gather_parameters(model);` (every process must open it; write_back = true "
                 "keeps what is written or loaded into them)\n",
                 names.c_str());
    std::fflush(stderr);
    std::abort();
  }
  // The order of first gathers (Note [Prefetching the next unit]).
  if (in_forward_ || backward_due_)
    for (auto u : touched)
      if ((!units_[u].gathered || u == inflight_) &&
          std::find(recording_.begin(), recording_.end(), u) == recording_.end())
        recording_.push_back(u);
  try {
    for (auto u : touched) gather(units_[u]);
  } catch (...) {
    // A failed engine may still write into a unit's memory (a message still posted): kept, not freed (`orphan`).
    for (auto u : touched) comm_ && comm_->broken() ? orphan(units_[u]) : free(units_[u]);
    keep_failure(std::current_exception());
    return;  // the operator fails on the freed storage; the door rethrows this
  }
  const std::size_t next = prefetch_target(touched);
  if (in_forward_ && options_.reshard_after_forward)  // another unit's forward started: the others are done
    for (std::size_t u = 1; u < units_.size(); ++u)
      if (u != next && std::find(touched.begin(), touched.end(), u) == touched.end()) free(units_[u]);
  if (next != npos) prefetch(next);
}

ACCEL_DECL std::size_t UnitSharder::prefetch_target(const std::vector<std::size_t>& touched) const {
  const bool forward = in_forward_;
  if (forward ? !options_.forward_prefetch : !(options_.backward_prefetch && backward_due_)) return npos;
  std::vector<std::size_t> reversed;
  const std::vector<std::size_t>* order = forward ? &forward_order_ : &backward_order_;
  if (!forward && backward_order_.empty()) {  // the first backward: the forward's order, reversed
    reversed.assign(forward_order_.rbegin(), forward_order_.rend());
    order = &reversed;
  }
  auto is_touched = [&](std::size_t u) { return std::find(touched.begin(), touched.end(), u) != touched.end(); };
  std::size_t at = npos;
  for (std::size_t i = 0; i < order->size(); ++i)
    if (is_touched((*order)[i])) at = i;
  if (at == npos) return npos;
  std::size_t next = npos;
  for (std::size_t i = at + 1; i < order->size() && next == npos; ++i) {
    const std::size_t v = (*order)[i];
    const auto& u = units_[v];
    if (is_touched(v) || (u.gathered && v != inflight_) || (!forward && u.complete)) continue;  // not needed
    next = v;
  }
  if (next == npos || forward || !options_.reshard_after_forward) return next;
  // In a backward, only one unit ahead: none gathered but the root, the operator's and the next one.
  for (std::size_t u = 1; u < units_.size(); ++u)
    if (units_[u].gathered && u != next && !is_touched(u)) return npos;
  return next;
}

ACCEL_DECL void UnitSharder::allocate(Unit& u) {
  auto* storage = u.full.storage().unsafeGetStorageImpl();
  const auto bytes = std::size_t(full_bytes(u));
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  u.gathered = true;
  gathered_bytes_ += std::int64_t(bytes);
  peak_bytes_ = std::max(peak_bytes_, gathered_bytes_);
}

ACCEL_DECL void UnitSharder::gather(Unit& u) {
  if (u.gathered && index_of(u) == inflight_) {
    finish_prefetch();
    ++prefetches_used_;
  }
  if (u.gathered || !u.full.defined()) return;
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  allocate(u);
  all_gather(u, u.full);
}

ACCEL_DECL void UnitSharder::prefetch(std::size_t v) {
  auto& u = units_[v];
  if (u.gathered || !u.full.defined()) return;
  settle_prefetch();  // one in flight at a time (a prediction that did not come true: kept gathered)
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  allocate(u);
  ++prefetches_;
  if (processes() == 1) {
    u.full.copy_(u.shard);
    inflight_ = v;  // prefetched, nothing to wait for (`pending_` empty)
    return;
  }
  try {
    // Under mp_policy the shard travels cast (all_gather's order); the cast copy lives until the all-gather ends.
    prefetch_part_ = u.shard.to(u.full.scalar_type());
    pending_ = comm_->all_gather_into_start(u.full, prefetch_part_);
    inflight_ = v;
  } catch (...) {  // it did not start; a failed engine may still hold what it posted: kept, not freed (`orphan`)
    comm_->broken() ? orphan(u) : free(u);
    keep_failure(std::current_exception());
  }
}

ACCEL_DECL void UnitSharder::finish_prefetch() {
  if (inflight_ == npos) return;
  auto& u = units_[std::exchange(inflight_, npos)];
  auto pending = std::exchange(pending_, {});
  if (!pending.native) {  // done already (one process, or an engine without a background all-gather)
    prefetch_part_ = at::Tensor();
    return;
  }
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);  // the engine's copies into the unit must not call touch (mu_ is held)
  try {
    comm_->finish(pending);
  } catch (...) {
    orphan(u);
    keep_sent();
    throw;
  }
  prefetch_part_ = at::Tensor();
}

ACCEL_DECL void UnitSharder::settle_prefetch() noexcept {
  if (inflight_ == npos) return;
  if (pending_.native &&
      comm_->broken()) {  // an earlier collective failed: its error is the one to report; nothing more to wait for
    orphan(units_[std::exchange(inflight_, npos)]);
    keep_sent();
    pending_ = {};
    return;
  }
  try {
    finish_prefetch();
  } catch (...) {
    keep_failure(std::current_exception());
  }
}

ACCEL_DECL void UnitSharder::keep_sent() noexcept {
  // As `orphan`: an engine that gave up on the all-gather may still read what it was sending; its handle is left
  // alive on purpose (the process group is unusable; the process ends soon).
  if (prefetch_part_.defined()) (void)new at::Tensor(std::exchange(prefetch_part_, at::Tensor()));
}

ACCEL_DECL void UnitSharder::orphan(Unit& u) noexcept {
  if (!u.gathered) return;
  auto* storage = u.full.storage().unsafeGetStorageImpl();
  // Not freed: the engine that gave up on the all-gather may still write into it (the process group is unusable).
  (void)storage->set_data_ptr(at::DataPtr(nullptr, storage->device())).release_context();
  storage->set_nbytes(0);
  u.gathered = false;
  gathered_bytes_ -= full_bytes(u);
}

ACCEL_DECL void UnitSharder::free(Unit& u) {
  if (!u.gathered) return;
  if (index_of(u) == inflight_) {
    settle_prefetch();  // unused: finished before its memory goes (a failure orphans it)
    if (!u.gathered) return;
  }
  auto* storage = u.full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  u.gathered = false;
  gathered_bytes_ -= full_bytes(u);
}

ACCEL_DECL void UnitSharder::reduce_ready() {
  // The reduce order: units from the last to the first, the root (index 0) last.
  while (next_reduce_ < units_.size()) {
    auto& u = units_[units_.size() - 1 - next_reduce_];
    if (u.trainable() && !u.complete) return;
    if (u.trainable()) reduce(u);
    ++next_reduce_;
  }
}

ACCEL_DECL void UnitSharder::reduce(Unit& u) {
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  const int n = processes();
  // The reduce dtype: mp_policy's reduce_dtype, else the gradients' own (param_dtype's under a policy).
  const auto& policy = options_.mp_policy;
  const auto dtype =
      policy.reduce_dtype && at::isFloatingType(u.grad.scalar_type()) ? *policy.reduce_dtype : u.full.scalar_type();
  // The average, as FSDP2 takes it: the sum divided by N (ReduceOp.AVG) where the sum cannot overflow; in fp16 each
  // gradient divided by N first.
  const bool predivide = dtype == at::kHalf;
  // Every element written once: a gradient's slot by its copy, an unused (or frozen) parameter's and the padding by
  // zeros.
  at::Tensor flat = at::empty({u.part * n}, u.grad.options().dtype(dtype));
  flat.narrow(0, u.total, u.part * n - u.total).zero_();
  for (auto& p : u.params) {
    at::Tensor slot = flat.narrow(0, p.offset, p.numel);
    auto& g = p.tensor.mutable_grad();
    if (p.trainable < 0 || !g.defined()) {  // unused: zeros
      slot.zero_();
      continue;
    }
    slot.copy_(g.reshape({-1}));  // cast to the reduce dtype (exact when it is wider)
    if (predivide) slot.div_(n);
    g = at::Tensor();  // the full gradient is released: this rank keeps its shard's
  }
  at::Tensor mine = at::empty({u.part}, flat.options());
  if (n > 1) {
    comm_->reduce_scatter(mine, flat);
    if (!predivide) mine.div_(n);
  } else {
    mine.copy_(flat);
  }
  u.grad.add_(mine);
}

ACCEL_DECL void UnitSharder::for_each_unit_whole(const std::function<void(const Unit&, const at::Tensor& whole)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  for (auto& u : units_) {
    if (!u.shard.defined()) continue;
    at::Tensor whole = at::empty({u.part * processes()}, u.shard.options());
    all_gather(u, whole);
    fn(u, whole);
  }
}

ACCEL_DECL void UnitSharder::gather_all() {
  std::lock_guard<std::mutex> lock(mu_);
  gathering_all_ = true;
  for (auto& u : units_) {
    if (!u.full.defined() || u.full.scalar_type() == u.shard.scalar_type() || u.exact.defined()) {
      gather(u);
      continue;
    }
    // mp_policy: the whole model is read (a checkpoint, summon_full_params) in the shards' dtype, not param_dtype's.
    c10::AutoGradMode no_grad(false);
    at::RecordFunctionGuard no_callbacks(false);
    u.exact = at::empty({u.part * processes()}, u.shard.options());
    all_gather(u, u.exact);
    for (auto& p : u.params) bind(u.exact, p);
    gathered_bytes_ += std::int64_t(u.exact.nbytes());
    peak_bytes_ = std::max(peak_bytes_, gathered_bytes_);
  }
}

ACCEL_DECL void UnitSharder::release_all(bool write_back) {
  std::lock_guard<std::mutex> lock(mu_);
  gathering_all_ = false;
  const std::int64_t r = rank();
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  for (auto& u : units_) {
    if (u.exact.defined()) {  // mp_policy: the parameters go back to the compute dtype's (freed) buffer
      for (auto& p : u.params) {
        if (write_back && moved_from(u.exact, p))
          u.exact.narrow(0, p.offset, p.numel).copy_(p.tensor.detach().reshape({-1}));
        bind(u.full, p);
      }
      if (write_back) u.shard.copy_(u.exact.narrow(0, r * u.part, u.part));
      gathered_bytes_ -= std::int64_t(u.exact.nbytes());
      u.exact = at::Tensor();
      continue;
    }
    if (write_back && u.gathered) {
      for (auto& p : u.params)  // LibTorch's InputArchive::read (load_state's, torch::load's) calls set_ on them
        if (moved(u, p)) adopt_moved(u, p);
      u.shard.copy_(u.full.narrow(0, r * u.part, u.part));
    }
    if (!in_forward_ && !backward_due_) free(u);
  }
}

// ---- a sharded checkpoint ------------------------------------------------------------------------------------

ACCEL_DECL at::Tensor UnitSharder::layout() const {
  std::int64_t rows = 0;
  for (const auto& u : units_) rows += std::int64_t(u.params.size());
  at::Tensor t = at::empty({rows, 3}, at::TensorOptions().dtype(at::kLong));
  auto v = t.accessor<std::int64_t, 2>();
  std::int64_t i = 0;
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (const auto& p : units_[u].params) {
      v[i][0] = std::int64_t(u), v[i][1] = p.numel, v[i][2] = p.offset;
      ++i;
    }
  return t;
}

ACCEL_DECL std::string UnitSharder::layout_names() const {
  std::string s;
  for (const auto& u : units_) {
    s += "unit " + u.name + "\n";
    for (const auto& p : u.params) s += p.name + "\n";
  }
  return s;
}

ACCEL_DECL void UnitSharder::save_shards(torch::serialize::OutputArchive& a) const {
  std::lock_guard<std::mutex> lock(mu_);
  a.write("fsdp_processes", c10::IValue(std::int64_t(processes())));
  a.write("fsdp_rank", c10::IValue(std::int64_t(rank())));
  a.write("fsdp_layout", layout());
  a.write("fsdp_names", c10::IValue(layout_names()));
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].shard.defined()) a.write("fsdp_unit_" + std::to_string(u), units_[u].shard);
  for (const auto& b : root_->named_buffers()) a.write("buffer." + b.key(), b.value());
}

ACCEL_DECL void UnitSharder::check_shards(torch::serialize::InputArchive& a, std::int64_t processes,
                                          std::int64_t rank) const {
  const std::string what = "rank " + std::to_string(rank) + "'s shards";
  auto integer = [&](const char* key) {
    c10::IValue v;
    if (!a.try_read(key, v) || !v.isInt())
      throw InvalidArgument(what + " are not a fully sharded model's (no integer '" + key +
                            "'); resume with the configuration that saved them");
    return v.toInt();
  };
  const std::int64_t saved_processes = integer("fsdp_processes"), saved_rank = integer("fsdp_rank");
  if (saved_processes != processes || saved_rank != rank)
    throw InvalidArgument(what + " hold rank " + std::to_string(saved_rank) + "'s shards of " +
                          std::to_string(saved_processes) + " process(es), where rank " + std::to_string(rank) +
                          "'s of " + std::to_string(processes) + " belong (one file is not this checkpoint's)");
  // The layout: a model cut into other units, or with other parameters, would put the saved values on other
  // elements.
  at::Tensor saved;
  c10::IValue names;
  const bool has = a.try_read("fsdp_layout", saved) && a.try_read("fsdp_names", names);
  const bool same_layout = has && saved.defined() && saved.scalar_type() == at::kLong && saved.dim() == 2 &&
                           saved.layout() == at::kStrided && at::equal(saved.cpu().contiguous(), layout());
  const std::string mine = layout_names();
  if (!same_layout || !names.isString() || names.toStringRef() != mine) {
    std::string differ;
    if (names.isString()) {  // the first line that differs, to name the module
      const std::string& theirs = names.toStringRef();
      std::size_t at = 0;
      while (at < mine.size() && at < theirs.size() && mine[at] == theirs[at]) ++at;
      const std::size_t from = at == 0 ? 0 : mine.rfind('\n', at - 1) + 1;  // the line's start (npos + 1 is 0)
      auto line = [&](const std::string& s) {
        const std::string l = from < s.size() ? s.substr(from, s.find('\n', from) - from) : std::string();
        return l.empty() ? std::string("nothing more") : "'" + l.substr(0, 200) + "'";
      };
      if (at < mine.size() || at < theirs.size())
        differ = " (this model's layout has " + line(mine) + " where the checkpoint's has " + line(theirs) + ")";
    }
    throw InvalidArgument("accel::shard::parameters: mismatched units: " + what +
                          " hold the shards of a model cut into other units (or with other parameters) than this "
                          "one" +
                          differ +
                          "; resume with the same model and the same Options::sharding (units, min_num_params, "
                          "unit_if)");
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = units_[u];
    if (!unit.shard.defined()) continue;
    const std::string key = "fsdp_unit_" + std::to_string(u);
    at::Tensor t;
    const std::int64_t part = (unit.total + processes - 1) / processes;
    if (!a.try_read(key, t) || !t.defined())
      throw InvalidArgument(what + " hold no '" + key + "' (the shard of " +
                            (u == 0 ? std::string("the root unit") : "unit '" + unit.name + "'") + ")");
    if (t.scalar_type() != unit.shard.scalar_type() || t.dim() != 1 || t.numel() != part ||
        t.layout() != at::kStrided || (part > 1 && t.stride(0) != 1))
      throw InvalidArgument(what + ": '" + key + "' (the shard of " +
                            (u == 0 ? std::string("the root unit") : "unit '" + unit.name + "'") + ") is " +
                            std::string(c10::toString(t.scalar_type())) + " of " + std::to_string(t.numel()) +
                            " elements, not a dense " + std::string(c10::toString(unit.shard.scalar_type())) + " of " +
                            std::to_string(part));
  }
  for (const auto& b : root_->named_buffers()) {
    at::Tensor t;
    if (!a.try_read("buffer." + b.key(), t) || !t.defined())
      throw InvalidArgument(what + " hold no buffer '" + b.key() + "' of the model");
    const auto& want = b.value();
    bool dense = t.layout() == at::kStrided && t.is_contiguous();
    if (t.scalar_type() != want.scalar_type() || t.sizes() != want.sizes() || !dense)
      throw InvalidArgument(what + ": buffer '" + b.key() + "' is " + std::string(c10::toString(t.scalar_type())) +
                            " " + c10::str(t.sizes()) + ", the model's is a dense " +
                            std::string(c10::toString(want.scalar_type())) + " " + c10::str(want.sizes()));
  }
}

ACCEL_DECL void UnitSharder::load_buffers(torch::serialize::InputArchive& a) {
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  for (auto& b : root_->named_buffers()) {
    at::Tensor t;
    a.read("buffer." + b.key(), t);
    b.value().copy_(t);
  }
}

ACCEL_DECL void UnitSharder::regather() {
  for (auto& u : units_) {
    if (u.gathered) all_gather(u, u.full);
    if (u.exact.defined()) all_gather(u, u.exact);
  }
}

ACCEL_DECL void UnitSharder::load_shards(torch::serialize::InputArchive& a) {
  std::lock_guard<std::mutex> lock(mu_);
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].shard.defined()) continue;
    at::Tensor t;
    a.read("fsdp_unit_" + std::to_string(u), t);
    units_[u].shard.copy_(t);
  }
  load_buffers(a);
  regather();
}

ACCEL_DECL void UnitSharder::load_resharded(std::vector<torch::serialize::InputArchive>& parts) {
  std::lock_guard<std::mutex> lock(mu_);
  c10::AutoGradMode no_grad(false);
  at::RecordFunctionGuard no_callbacks(false);
  const std::int64_t n = std::int64_t(parts.size()), r = rank();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    auto& unit = units_[u];
    if (!unit.shard.defined()) continue;
    // This rank's elements [r * P, (r + 1) * P) of the unit, from saved rank k's [k * P', (k + 1) * P'); the
    // padding past the unit's elements stays zero.
    const std::int64_t saved_part = (unit.total + n - 1) / n, lo = r * unit.part,
                       hi = std::min(lo + unit.part, unit.total);
    unit.shard.zero_();
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t a = std::max(lo, k * saved_part), b = std::min(hi, (k + 1) * saved_part);
      if (a >= b) continue;
      at::Tensor t;
      parts[std::size_t(k)].read("fsdp_unit_" + std::to_string(u), t);
      unit.shard.narrow(0, a - lo, b - a).copy_(t.narrow(0, a - k * saved_part, b - a));
    }
  }
  load_buffers(parts.front());
  regather();
}

}  // namespace accel
