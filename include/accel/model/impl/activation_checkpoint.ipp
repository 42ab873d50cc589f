#pragma once
//! \file
//! The definitions of activation checkpointing's non-template code (model/activation_checkpoint.hpp, included at its
//! end): the operator callback that finds what a checkpointed call reads (the dispatcher's RecordFunction), the
//! generators' and autocast's states, and the node's backward (the autograd engine's `grad`), which stay out of user
//! code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/model/activation_checkpoint.hpp>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <string>
#include <unordered_set>

namespace accel {

namespace detail {

// The tensors requiring grad that the operators of a checkpointed forward read (Note [What a checkpointed call
// differentiates]), each once.
struct CheckpointCapture {
  std::vector<at::Tensor> tensors;
  std::unordered_set<const c10::TensorImpl*> seen;
  void add(const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      // Only what the plain call would differentiate: a tensor with a gradient edge (a leaf that requires grad, or
      // the result of a recorded operation); a view made under no grad (here, of a parameter) has none.
      if (t.defined() && t.requires_grad() && !seen.count(t.unsafeGetTensorImpl()) &&
          torch::autograd::impl::gradient_edge(t).is_valid()) {
        seen.insert(t.unsafeGetTensorImpl());
        tensors.push_back(t);
      }
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) add(c10::IValue(t));
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) add(e);
    } else if (v.isTuple()) {
      for (const auto& e : v.toTupleRef().elements()) add(e);
    }
  }
};

inline thread_local CheckpointCapture* checkpoint_capture = nullptr;

inline std::unique_ptr<at::ObserverContext> on_checkpointed_operator(const at::RecordFunction& fn) {
  if (auto* c = checkpoint_capture)
    for (const auto& v : record_function_inputs(fn)) c->add(v);  // model/impl/unit_sharder.ipp
  return nullptr;
}

inline std::string describe_results(const std::vector<CheckpointState::Result>& r) {
  std::string out = std::to_string(r.size()) + " tensor(s)";
  for (std::size_t k = 0; k < r.size(); ++k) {
    out += k == 0 ? ": " : ", ";
    out += std::string(c10::toString(r[k].dtype)) + c10::str(at::IntArrayRef(r[k].sizes));
  }
  return out;
}

// The generators during a recomputation: the call's states in, the current ones back afterwards (torch's fork_rng).
class ForkedGenerators {
 public:
  explicit ForkedGenerators(const CheckpointState& s) : active_(s.rng) {
    if (!active_) return;
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpu.mutex());
      cpu_ = cpu.get_state();
      cpu.set_state(s.cpu_rng);
    }
    for (const auto& [device, state] : s.device_rng) {
      at::Generator g = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(g.mutex());
      devices_.emplace_back(device, g.get_state());
      g.set_state(state);
    }
  }
  ~ForkedGenerators() {
    if (!active_) return;
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpu.mutex());
      cpu.set_state(cpu_);
    }
    for (const auto& [device, state] : devices_) {
      at::Generator g = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    }
  }
  ForkedGenerators(const ForkedGenerators&) = delete;
  ForkedGenerators& operator=(const ForkedGenerators&) = delete;

 private:
  bool active_;
  at::Tensor cpu_;
  std::vector<std::pair<c10::Device, at::Tensor>> devices_;
};

// Autocast during a recomputation: the call's state (CPU and CUDA), entered as `torch.autocast` enters (its cast
// cache cleared on leaving the outermost region), the current one back afterwards.
class CallAutocast {
 public:
  explicit CallAutocast(const CheckpointState& s)
      : cpu_(at::autocast::is_autocast_enabled(at::kCPU)),
        cuda_(at::autocast::is_autocast_enabled(at::kCUDA)),
        cache_(at::autocast::is_autocast_cache_enabled()),
        cpu_dtype_(at::autocast::get_autocast_dtype(at::kCPU)),
        cuda_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)),
        region_(s.cpu_autocast || s.cuda_autocast) {
    at::autocast::set_autocast_enabled(at::kCPU, s.cpu_autocast);
    at::autocast::set_autocast_dtype(at::kCPU, s.cpu_autocast_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, s.cuda_autocast);
    at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_autocast_dtype);
    at::autocast::set_autocast_cache_enabled(s.autocast_cache);
    if (region_) at::autocast::increment_nesting();
  }
  ~CallAutocast() {
    if (region_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, cpu_);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype_);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype_);
    at::autocast::set_autocast_cache_enabled(cache_);
  }
  CallAutocast(const CallAutocast&) = delete;
  CallAutocast& operator=(const CallAutocast&) = delete;

 private:
  bool cpu_, cuda_, cache_;
  at::ScalarType cpu_dtype_, cuda_dtype_;
  bool region_;
};

ACCEL_DECL void save_call_state(CheckpointState& state, const std::vector<at::Tensor>& arguments, bool rng) {
  state.cpu_autocast = at::autocast::is_autocast_enabled(at::kCPU);
  state.cuda_autocast = at::autocast::is_autocast_enabled(at::kCUDA);
  state.cpu_autocast_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  state.cuda_autocast_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  state.autocast_cache = at::autocast::is_autocast_cache_enabled();
  state.rng = rng;
  if (!rng) return;
  {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    state.cpu_rng = cpu.get_state();
  }
  // [torch:utils/checkpoint.py get_device_states]: the generators of the devices the tensor arguments are on.
  for (const auto& a : arguments) {
    if (!a.defined() || !a.is_cuda()) continue;
    const c10::Device device = a.device();
    bool seen = false;
    for (const auto& d : state.device_rng) seen = seen || d.first == device;
    if (seen) continue;
    at::Generator g = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    state.device_rng.emplace_back(device, g.get_state());
  }
}

ACCEL_DECL void run_capturing(CheckpointState& state, std::vector<at::Tensor>& arguments,
                              std::vector<at::Tensor>& captured) {
  // The call reads detached arguments: they are the node's inputs already, not something it captures.
  std::vector<at::Tensor> detached;
  detached.reserve(arguments.size());
  for (const auto& a : arguments) detached.push_back(a.detach());
  std::vector<at::Tensor> results;
  {
    CheckpointCapture capture;
    c10::AutoGradMode no_grad(false);
    at::RecordFunctionGuard observed(true);
    CheckpointCapture* outer = std::exchange(checkpoint_capture, &capture);
    const auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&on_checkpointed_operator).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
    struct Restore {
      at::CallbackHandle handle;
      CheckpointCapture* outer;
      ~Restore() {
        at::removeCallback(handle);
        checkpoint_capture = outer;
      }
    } restore{handle, outer};
    results = state.run(detached);
    captured = std::move(capture.tensors);
  }
  if (results.empty())
    throw InvalidArgument(
        "accel::activation_checkpoint(fn, args...): fn returned no tensor (an empty std::vector); a checkpointed call "
        "returns the tensors the rest of the forward uses: return them, or do not checkpoint this call");
  state.results.clear();
  for (std::size_t k = 0; k < results.size(); ++k) {
    if (!results[k].defined())
      throw InvalidArgument("accel::activation_checkpoint(fn, args...): fn's result " + std::to_string(k) +
                            " is an undefined tensor; a checkpointed call returns defined tensors: return only those "
                            "the rest of the forward uses");
    state.results.push_back({results[k].sizes().vec(), results[k].scalar_type()});
    // A view of something computed inside would be a view the node outputs (in-place changes to it refused by
    // autograd): the node outputs a plain alias instead.
    results[k] = results[k].detach();
  }
  state.outputs = std::move(results);
}

}  // namespace detail

ACCEL_DECL torch::autograd::variable_list detail::CheckpointFunction::backward(torch::autograd::AutogradContext* ctx,
                                                                               torch::autograd::variable_list grads) {
  auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data.at("accel_checkpoint").toCapsule());
  torch::autograd::variable_list saved;
  try {
    saved = ctx->get_saved_variables();
  } catch (const c10::Error&) {
    throw InvalidArgument(
        "accel::activation_checkpoint: a second backward through a checkpointed call, whose saved inputs the first "
        "backward "
        "freed (as it frees every saved tensor); to run two backwards through the graph, pass retain_graph = true "
        "to the first (loss.backward({}, /*retain_graph=*/true))");
  }
  const std::size_t n = state->arguments;
  // The recomputation: fresh leaves of the arguments, the call's generators and autocast, with grad.
  std::vector<at::Tensor> leaves;
  leaves.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    at::Tensor leaf = saved[i].detach();
    if (saved[i].requires_grad()) leaf.requires_grad_(true);
    leaves.push_back(std::move(leaf));
  }
  const bool create_graph = at::GradMode::is_enabled();  // the engine runs a node with grad under create_graph
  std::vector<at::Tensor> results;
  {
    ForkedGenerators generators(*state);
    CallAutocast autocast(*state);
    c10::AutoGradMode grad(true);
    results = state->run(leaves);
  }
  std::vector<CheckpointState::Result> again;
  for (const auto& r : results)
    again.push_back({r.defined() ? r.sizes().vec() : std::vector<std::int64_t>{},
                     r.defined() ? r.scalar_type() : at::ScalarType::Undefined});
  bool same = again.size() == state->results.size();
  for (std::size_t k = 0; same && k < again.size(); ++k)
    same = again[k].sizes == state->results[k].sizes && again[k].dtype == state->results[k].dtype;
  if (!same)
    throw InvalidArgument("accel::activation_checkpoint: the recomputation in the backward returned " +
                          describe_results(again) + " where the forward returned " + describe_results(state->results) +
                          "; a checkpointed call runs twice and must compute the same thing both times: keep what it "
                          "depends on (a flag, a counter, a module's mode) unchanged until the backward");
  torch::autograd::variable_list outputs, output_grads;
  for (std::size_t k = 0; k < results.size(); ++k)
    if (grads[k].defined() && results[k].requires_grad()) {
      outputs.push_back(results[k]);
      output_grads.push_back(grads[k]);
    }
  // Gradients for: the node's first argument (the state), the tensor arguments, the captured tensors.
  torch::autograd::variable_list out(1 + saved.size());
  torch::autograd::variable_list wrt;
  std::vector<std::size_t> slot;
  for (std::size_t i = 0; i < n; ++i)
    if (leaves[i].requires_grad()) wrt.push_back(leaves[i]), slot.push_back(1 + i);
  for (std::size_t j = n; j < saved.size(); ++j) wrt.push_back(saved[j]), slot.push_back(1 + j);
  if (outputs.empty() || wrt.empty()) return out;
  const auto g = torch::autograd::grad(outputs, wrt, output_grads, /*retain_graph=*/create_graph, create_graph,
                                       /*allow_unused=*/true);
  for (std::size_t k = 0; k < g.size(); ++k) out[slot[k]] = g[k];
  return out;
}

}  // namespace accel
