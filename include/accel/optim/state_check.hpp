#pragma once
//! \file
//! `optimizer_state_problem`: whether the state a LibTorch optimizer holds (after `load`) is one that it could have
//! reached itself, checked before a checkpoint's state is kept (`AcceleratedOptimizer::check`).
//!
//! Note [An optimizer's state from elsewhere]
//! LibTorch's `Optimizer::load` takes a saved state as it comes: the groups' options as written, and per parameter
//! whatever tensors the archive holds. A state tensor of another shape fails at the first step with a LibTorch
//! message that names no file (or broadcasts: a `[1]` buffer trains silently); one in double precision for a float
//! parameter trains silently in another precision; an option that the constructor refuses (a negative rate,
//! momentum or weight decay, NaN, Nesterov with dampening, betas outside [0, 1)) steps without a word. So, for the
//! optimizers LibTorch ships (SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS), every group's options are checked as
//! their constructor checks them (NaN never passes), and every state tensor that a step uses must exist and have
//! its parameter's shape, dtype and kind of device (LBFGS's: the flat length of all its parameters), and be dense (no
//! overlapping elements, no gaps: a forged stride of 0 would make a step write one element twice); every counter
//! is 0 or more. Another optimizer's tensors are not known to accel: only its groups' rates are checked.

#include <accel/detail/linkage.hpp>

#include <c10/util/irange.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace accel {

namespace detail {

inline std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The options of one group, as the optimizer's constructor checks them; "" if they pass.
inline std::string options_problem(const torch::optim::OptimizerOptions& o) {
  std::string out;
  auto need = [&](const char* name, double v, bool ok, const char* rule) {
    if (out.empty() && !ok) out = std::string("'") + name + "' is " + number(v) + " (" + rule + ")";
  };
  auto at_least_0 = [&](const char* name, double v) { need(name, v, v >= 0, "0 or more"); };
  auto beta = [&](const char* name, double v) { need(name, v, v >= 0 && v < 1, "in [0, 1)"); };
  auto adam_like = [&](const auto& a) {  // Adam's and AdamW's options have the same fields and checks
    at_least_0("lr", a.lr());
    at_least_0("eps", a.eps());
    beta("betas[0]", std::get<0>(a.betas()));
    beta("betas[1]", std::get<1>(a.betas()));
    at_least_0("weight_decay", a.weight_decay());
  };
  if (const auto* s = dynamic_cast<const torch::optim::SGDOptions*>(&o)) {
    at_least_0("lr", s->lr());
    at_least_0("momentum", s->momentum());
    need("dampening", s->dampening(), s->dampening() == s->dampening(), "a number");
    at_least_0("weight_decay", s->weight_decay());
    if (out.empty() && s->nesterov() && !(s->momentum() > 0 && s->dampening() == 0))
      out = "'nesterov' is true with momentum " + number(s->momentum()) + " and dampening " + number(s->dampening()) +
            " (Nesterov momentum needs a momentum and zero dampening)";
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamOptions*>(&o)) {
    adam_like(*a);
  } else if (const auto* w = dynamic_cast<const torch::optim::AdamWOptions*>(&o)) {
    adam_like(*w);
  } else if (const auto* r = dynamic_cast<const torch::optim::RMSpropOptions*>(&o)) {
    at_least_0("lr", r->lr());
    at_least_0("alpha", r->alpha());
    at_least_0("eps", r->eps());
    at_least_0("weight_decay", r->weight_decay());
    at_least_0("momentum", r->momentum());
  } else if (const auto* g = dynamic_cast<const torch::optim::AdagradOptions*>(&o)) {
    at_least_0("lr", g->lr());
    at_least_0("lr_decay", g->lr_decay());
    at_least_0("weight_decay", g->weight_decay());
    at_least_0("initial_accumulator_value", g->initial_accumulator_value());
    at_least_0("eps", g->eps());
  } else if (const auto* l = dynamic_cast<const torch::optim::LBFGSOptions*>(&o)) {
    at_least_0("lr", l->lr());
    need("max_iter", double(l->max_iter()), l->max_iter() >= 1, "1 or more");
    need("history_size", double(l->history_size()), l->history_size() >= 1, "1 or more");
    at_least_0("tolerance_grad", l->tolerance_grad());
    at_least_0("tolerance_change", l->tolerance_change());
  } else {
    at_least_0("lr", o.get_lr());
  }
  return out;
}

// A state tensor `t` (the field `name`) beside its parameter `p`: it must exist when `required`, and if it
// exists, have `p`'s shape (or `numel` elements, flat), dtype and kind of device.
inline std::string tensor_problem(const char* name, const at::Tensor& t, const at::Tensor& p, bool required,
                                  std::optional<std::int64_t> numel = std::nullopt) {
  if (!t.defined()) return required ? std::string("'") + name + "' is missing" : std::string();
  const bool shape = numel ? (t.dim() == 1 && t.numel() == *numel) : t.sizes().equals(p.sizes());
  if (shape && t.scalar_type() == p.scalar_type() && t.device().type() == p.device().type()) {
    if (t.is_non_overlapping_and_dense()) return {};
    return std::string("'") + name + "' has strides " + c10::str(t.strides()) +
           ", whose elements overlap or leave gaps";
  }
  std::ostringstream s;
  s << "'" << name << "' is " << t.sizes() << " " << t.scalar_type() << " on " << t.device().type()
    << ", the parameter's is " << (numel ? "[" + std::to_string(*numel) + "]" : c10::str(p.sizes())) << " "
    << p.scalar_type() << " on " << p.device().type();
  return s.str();
}
inline std::string counter_problem(const char* name, std::int64_t v) {
  return v >= 0 ? std::string() : std::string("'") + name + "' is " + std::to_string(v) + " (0 or more)";
}

// The state of parameter `p` (of a group with options `o`), as its optimizer's step reads it.
inline std::string param_state_problem(const torch::optim::OptimizerParamState& state,
                                       const torch::optim::OptimizerOptions& o, const at::Tensor& p) {
  std::string out;
  auto first = [&](std::string s) {
    if (out.empty()) out = std::move(s);
  };
  auto adam_like = [&](const auto& a, const auto* opts) {  // Adam's and AdamW's states have the same fields
    first(counter_problem("step", a.step()));
    first(tensor_problem("exp_avg", a.exp_avg(), p, true));
    first(tensor_problem("exp_avg_sq", a.exp_avg_sq(), p, true));
    first(tensor_problem("max_exp_avg_sq", a.max_exp_avg_sq(), p, opts && opts->amsgrad()));
  };
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    const auto* opts = dynamic_cast<const torch::optim::SGDOptions*>(&o);
    first(tensor_problem("momentum_buffer", s->momentum_buffer(), p, opts && opts->momentum() != 0));
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    adam_like(*a, dynamic_cast<const torch::optim::AdamOptions*>(&o));
  } else if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    adam_like(*w, dynamic_cast<const torch::optim::AdamWOptions*>(&o));
  } else if (const auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    const auto* opts = dynamic_cast<const torch::optim::RMSpropOptions*>(&o);
    first(counter_problem("step", r->step()));
    first(tensor_problem("square_avg", r->square_avg(), p, true));
    first(tensor_problem("momentum_buffer", r->momentum_buffer(), p, opts && opts->momentum() > 0));
    first(tensor_problem("grad_avg", r->grad_avg(), p, opts && opts->centered()));
  } else if (const auto* g = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    first(counter_problem("step", g->step()));
    first(tensor_problem("sum", g->sum(), p, true));
  }
  return out;
}

// LBFGS keeps one state, on its first parameter, of flat tensors over all its parameters.
inline std::string lbfgs_state_problem(const torch::optim::LBFGSParamState& s, const std::vector<at::Tensor>& params) {
  std::int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  const auto& p = params.front();
  std::string out;
  auto first = [&](std::string x) {
    if (out.empty()) out = std::move(x);
  };
  first(counter_problem("func_evals", s.func_evals()));
  first(counter_problem("n_iter", s.n_iter()));
  first(tensor_problem("d", s.d(), p, false, n));
  first(tensor_problem("prev_flat_grad", s.prev_flat_grad(), p, false, n));
  for (const auto& t : s.old_dirs()) first(tensor_problem("old_dirs", t, p, true, n));
  for (const auto& t : s.old_stps()) first(tensor_problem("old_stps", t, p, true, n));
  if (out.empty() && (s.old_dirs().size() != s.old_stps().size() || s.ro().size() != s.old_dirs().size()))
    out = "'old_dirs', 'old_stps' and 'ro' hold " + std::to_string(s.old_dirs().size()) + ", " +
          std::to_string(s.old_stps().size()) + " and " + std::to_string(s.ro().size()) + " entries (the same number)";
  return out;
}

}  // namespace detail

//! What makes `opt`'s options or state one that it could not have reached ("group 0: 'momentum' is -0.5, ..."),
//! "" if nothing (Note [An optimizer's state from elsewhere]).
inline std::string optimizer_state_problem(torch::optim::Optimizer& opt) {
  auto& groups = opt.param_groups();
  auto& state = opt.state();
  for (const auto g : c10::irange(groups.size())) {
    const auto where = "group " + std::to_string(g);
    if (auto what = detail::options_problem(groups[g].options()); !what.empty()) return where + ": " + what;
    const auto& params = groups[g].params();
    if (dynamic_cast<const torch::optim::LBFGSOptions*>(&groups[g].options())) {
      if (params.empty()) continue;
      const auto it = state.find(params.front().unsafeGetTensorImpl());
      if (it == state.end()) continue;
      const auto* s = dynamic_cast<const torch::optim::LBFGSParamState*>(it->second.get());
      if (!s) return where + ": a state that is not LBFGS's";
      if (auto what = detail::lbfgs_state_problem(*s, params); !what.empty()) return where + ": " + what;
      continue;
    }
    for (const auto k : c10::irange(params.size())) {
      const auto it = state.find(params[k].unsafeGetTensorImpl());
      if (it == state.end()) continue;
      if (auto what = detail::param_state_problem(*it->second, groups[g].options(), params[k]); !what.empty())
        return where + ", parameter " + std::to_string(k) + ": " + what;
    }
  }
  return {};
}

//! Loads `a` into `opt` and returns `optimizer_state_problem` of what it then holds; puts back the state and options
//! `opt` had (kept aside, not copied) when there is a problem, when the load throws, or unless `keep`. The load
//! starts from an empty state (LibTorch's leaves the state of a parameter the archive does not name).
inline std::string load_and_check(torch::optim::Optimizer& opt, torch::serialize::InputArchive& a, bool keep) {
  auto kept_state = std::move(opt.state());
  opt.state().clear();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> kept_options;
  for (auto& g : opt.param_groups()) kept_options.push_back(g.options().clone());
  auto put_back = [&] {
    opt.state() = std::move(kept_state);
    for (std::size_t i = 0; i < kept_options.size(); ++i) opt.param_groups()[i].set_options(std::move(kept_options[i]));
  };
  std::string what;
  try {
    opt.load(a);
    what = optimizer_state_problem(opt);
  } catch (...) {
    put_back();
    throw;
  }
  if (!what.empty() || !keep) put_back();
  return what;
}

}  // namespace accel
