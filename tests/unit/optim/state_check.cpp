// An optimizer's state from elsewhere (optim/state_check.hpp, Note [An optimizer's state from elsewhere]): a state
// tensor that does not fit its parameter, a counter below 0 or an option the constructor refuses is refused by
// AcceleratedOptimizer::check and ::load, naming the group, the parameter and the field, and changes nothing; every
// state a LibTorch optimizer reaches itself loads.
#include "../support.hpp"

#include <accel/optim/accelerated.hpp>

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

// Two parameters ([4, 3] and [3]) with gradients, and an optimizer of kind `O` over them that has stepped twice.
template <class O, class Options>
struct Stepped {
  std::vector<at::Tensor> params{at::ones({4, 3}).requires_grad_(), at::ones({3}).requires_grad_()};
  std::shared_ptr<O> opt;
  explicit Stepped(Options o) : opt(std::make_shared<O>(params, o)) {
    for (int k = 0; k < 2; ++k) {
      for (auto& p : params) p.mutable_grad() = at::ones_like(p) * (k + 1);
      opt->step();
    }
  }
  // Its saved state after `edit` changed it (as a checkpoint from elsewhere holds it), ready to load.
  torch::serialize::InputArchive saved(const std::function<void(O&)>& edit = {}) {
    if (edit) edit(*opt);
    torch::serialize::OutputArchive out;
    opt->save(out);
    return accel_test::reread(out);
  }
};

template <class State, class O>
State& state_of(O& opt, std::size_t param) {
  auto& group = opt.param_groups()[0];
  return static_cast<State&>(*opt.state().at(group.params()[param].unsafeGetTensorImpl()));
}

// The state an optimizer of kind `O` reached after two steps loads into a fresh one, whose check changes nothing.
template <class O, class Options>
void loads(Options o) {
  Stepped<O, Options> stepped(o);
  auto saved = stepped.saved();
  std::vector<at::Tensor> params{at::ones({4, 3}).requires_grad_(), at::ones({3}).requires_grad_()};
  auto fresh = std::make_shared<O>(params, o);
  accel::AcceleratedOptimizer<O> wrapped(fresh);
  const auto before = fresh->state().size();  // Adagrad's constructor makes a state for each parameter
  CHECK_NOTHROW(wrapped.check(saved));
  CHECK(fresh->state().size() == before);  // check leaves the optimizer as it was
  CHECK_NOTHROW(wrapped.load(saved));
  CHECK(accel::optimizer_state_problem(*fresh).empty());
  CHECK(fresh->state().size() == stepped.opt->state().size());
}

// `saved` is refused with `message` by a fresh optimizer of the same kind, whose state stays as it was (none).
template <class O, class Options>
void refused(torch::serialize::InputArchive saved, Options o, const std::string& message) {
  std::vector<at::Tensor> params{at::ones({4, 3}).requires_grad_(), at::ones({3}).requires_grad_()};
  auto fresh = std::make_shared<O>(params, o);
  accel::AcceleratedOptimizer<O> wrapped(fresh);
  const auto before = fresh->state().size();
  CHECK_THROWS_WITH(wrapped.check(saved), Catch::Contains(message));
  CHECK(fresh->state().size() == before);
  CHECK_THROWS_WITH(wrapped.load(saved), Catch::Contains(message));
  CHECK(fresh->state().size() == before);
  CHECK(fresh->param_groups()[0].options().get_lr() == o.get_lr());
}

}  // namespace

TEST_CASE("optimizer states: what each LibTorch optimizer reaches itself loads", "[optim][state]") {
  using namespace torch::optim;
  loads<SGD>(SGDOptions(0.1).momentum(0.9).nesterov(true));
  loads<Adam>(AdamOptions(0.01).amsgrad(true));
  loads<AdamW>(AdamWOptions(0.01));
  loads<RMSprop>(RMSpropOptions(0.01).momentum(0.5).centered(true));
  loads<Adagrad>(AdagradOptions(0.1));
  // LBFGS: LibTorch cannot save one that has stepped (its 'al' holds undefined tensors), so its state is checked
  // as the optimizer holds it.
  std::vector<at::Tensor> params{at::ones({4, 3}).requires_grad_(), at::ones({3}).requires_grad_()};
  LBFGS lbfgs(params, LBFGSOptions(0.1));
  auto state = std::make_unique<LBFGSParamState>();
  state->d(at::zeros({15}));
  state->old_dirs().push_back(at::zeros({15}));
  state->old_stps().push_back(at::zeros({15}));
  state->ro().push_back(at::ones({}));
  auto& held = *state;
  lbfgs.state()[params[0].unsafeGetTensorImpl()] = std::move(state);
  CHECK(accel::optimizer_state_problem(lbfgs).empty());
  held.d(at::zeros({14}));
  CHECK_THAT(accel::optimizer_state_problem(lbfgs),
             Catch::Contains("group 0: 'd' is [14] Float on cpu, the parameter's is [15] Float"));
  held.d(at::zeros({15}));
  held.ro().clear();
  CHECK_THAT(accel::optimizer_state_problem(lbfgs),
             Catch::Contains("'old_dirs', 'old_stps' and 'ro' hold 1, 1 and 0 entries"));
}

TEST_CASE("optimizer states: a state that does not fit its parameters is refused, naming where, changing nothing",
          "[optim][state]") {
  using Adam = torch::optim::Adam;
  using AO = torch::optim::AdamOptions;
  const AO adam = AO(0.01);
  auto with_exp_avg = [&](at::Tensor t) {
    Stepped<Adam, AO> s(adam);
    return s.saved([&](Adam& o) { state_of<torch::optim::AdamParamState>(o, 0).exp_avg(t); });
  };
  refused<Adam>(with_exp_avg(at::zeros({17})), adam,
                "group 0, parameter 0: 'exp_avg' is [17] Float on cpu, the parameter's is [4, 3] Float");
  refused<Adam>(with_exp_avg(at::zeros({3, 4})), adam, "'exp_avg' is [3, 4]");
  refused<Adam>(with_exp_avg(at::zeros({})), adam, "'exp_avg' is []");
  refused<Adam>(with_exp_avg(at::zeros({4, 3}, at::kDouble)), adam,
                "'exp_avg' is [4, 3] Double on cpu, the parameter's is [4, 3] Float");
  {
    Stepped<Adam, AO> s(adam);
    refused<Adam>(s.saved([](Adam& o) { state_of<torch::optim::AdamParamState>(o, 1).step(-3); }), adam,
                  "group 0, parameter 1: 'step' is -3 (0 or more)");
  }
  using SGD = torch::optim::SGD;
  using SO = torch::optim::SGDOptions;
  const SO sgd = SO(0.1).momentum(0.9);
  {
    Stepped<SGD, SO> s(sgd);
    refused<SGD>(s.saved([](SGD& o) { state_of<torch::optim::SGDParamState>(o, 1).momentum_buffer(at::zeros({1})); }),
                 sgd, "group 0, parameter 1: 'momentum_buffer' is [1]");
  }
  {
    Stepped<SGD, SO> s(sgd);
    refused<SGD>(s.saved([](SGD& o) { state_of<torch::optim::SGDParamState>(o, 0).momentum_buffer(at::Tensor()); }),
                 sgd, "'momentum_buffer' is missing");
  }
  using RMS = torch::optim::RMSprop;
  using RO = torch::optim::RMSpropOptions;
  const RO centered = RO(0.01).centered(true);
  {
    Stepped<RMS, RO> s(centered);
    refused<RMS>(s.saved([](RMS& o) { state_of<torch::optim::RMSpropParamState>(o, 0).grad_avg(at::Tensor()); }),
                 centered, "'grad_avg' is missing");
  }
}

TEST_CASE("optimizer states: options the constructor refuses are refused, NaN included", "[optim][state]") {
  using SGD = torch::optim::SGD;
  using SO = torch::optim::SGDOptions;
  const SO sgd = SO(0.1).momentum(0.9);
  auto sgd_with = [&](const std::function<void(SO&)>& edit) {
    Stepped<SGD, SO> s(sgd);
    return s.saved([&](SGD& o) { edit(static_cast<SO&>(o.param_groups()[0].options())); });
  };
  refused<SGD>(sgd_with([](SO& o) { o.lr(-0.1); }), sgd, "group 0: 'lr' is -0.1 (0 or more)");
  refused<SGD>(sgd_with([](SO& o) { o.lr(std::nan("")); }), sgd, "'lr' is nan");
  refused<SGD>(sgd_with([](SO& o) { o.momentum(-0.5); }), sgd, "'momentum' is -0.5 (0 or more)");
  refused<SGD>(sgd_with([](SO& o) { o.weight_decay(-1); }), sgd, "'weight_decay' is -1 (0 or more)");
  refused<SGD>(sgd_with([](SO& o) { o.nesterov(true).dampening(0.5); }), sgd,
               "'nesterov' is true with momentum 0.9 and dampening 0.5");
  using Adam = torch::optim::Adam;
  using AO = torch::optim::AdamOptions;
  const AO adam = AO(0.01);
  Stepped<Adam, AO> s(adam);
  refused<Adam>(s.saved([](Adam& o) {
    static_cast<AO&>(o.param_groups()[0].options()).betas({0.9, 1.0});
  }),
                adam, "'betas[1]' is 1 (in [0, 1))");
  // Other values the constructor accepts are a valid, different state.
  Stepped<SGD, SO> other(sgd);
  auto saved = other.saved([](SGD& o) { static_cast<SO&>(o.param_groups()[0].options()).lr(0.5).momentum(0.1); });
  Stepped<SGD, SO> target(sgd);
  accel::AcceleratedOptimizer<SGD> wrapped(target.opt);
  CHECK_NOTHROW(wrapped.load(saved));
  CHECK(target.opt->param_groups()[0].options().get_lr() == 0.5);
}
