// The PyTorch-exact schedulers (optim/schedulers.hpp) against PyTorch's own sequences (tests/golden/optim/
// schedulers.json, written by tests/golden/generate_schedulers.py with the pinned torch): every rate of every group
// after construction and after each step, bit for bit; get_last_lr; a state saved mid-sequence and loaded into a
// freshly built scheduler goes on identically; ReduceLROnPlateau through AcceleratedScheduler; a scheduler
// prepared by the Accelerator, checkpointed and resumed. And why they exist: LibTorch's StepLR is one step late.
#include "../support.hpp"
#include "../training_support.hpp"

#include <accel/optim/schedulers.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace accel_test;

namespace {

using Rows = std::vector<std::vector<double>>;

const nlohmann::json& schedule_golden() {
  static const nlohmann::json j = golden("../optim/schedulers.json");
  return j;
}

//! The generator's optimizer: two groups (0.1 and 0.03 in the golden file), SGD with momentum 0.9, Adam or AdamW.
struct Fixture {
  std::vector<at::Tensor> params{at::zeros({2}).requires_grad_(), at::zeros({3}).requires_grad_()};
  std::shared_ptr<torch::optim::Optimizer> opt;

  explicit Fixture(const std::string& kind) {
    const auto lrs = schedule_golden()["meta"]["lrs"].get<std::vector<double>>();
    std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup({params[0]}),
                                                          torch::optim::OptimizerParamGroup({params[1]})};
    if (kind == "sgd")
      opt = std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs[0]).momentum(0.9));
    else if (kind == "adam")
      opt = std::make_shared<torch::optim::Adam>(groups, torch::optim::AdamOptions(lrs[0]));
    else if (kind == "adamw")
      opt = std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lrs[0]));
    else
      FAIL("unknown optimizer " << kind);
    for (std::size_t i = 0; i < lrs.size(); ++i) opt->param_groups()[i].options().set_lr(lrs[i]);
  }
  [[nodiscard]] std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& g : opt->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  [[nodiscard]] std::vector<double> momenta() const {
    std::vector<double> out;
    for (auto& g : opt->param_groups()) out.push_back(*accel::detail::momentum_slot(g.options()));
    return out;
  }
};

//! The generator's plain lambdas ("power"): 0.97^epoch for the first group, 1 / (1 + epoch) for the second.
//! For MultiplicativeLR ("mult"): 0.95 for the first group, 1 - 1 / (10 + epoch) for the second; "mult_one": one
//! function for both groups, 0.8 every third epoch.
accel::LambdaLR::Fn lambda_of(const nlohmann::json& p, std::size_t group) {
  if (p["fn"] == "mult_one") return [](std::int64_t e) { return e % 3 == 0 ? 0.8 : 1.0; };
  if (p["fn"] == "mult") {
    if (group == 0) return [](std::int64_t) { return 0.95; };
    return [](std::int64_t e) { return 1.0 - 1.0 / (10.0 + double(e)); };
  }
  if (p["fn"] != "power") FAIL("no lambda " << p["fn"]);
  if (group == 0) return [](std::int64_t e) { return std::pow(0.97, double(e)); };
  return [](std::int64_t e) { return 1.0 / (1.0 + double(e)); };
}

//! One value, or a list of them, as a vector.
std::vector<double> many(const nlohmann::json& v) {
  return v.is_array() ? v.get<std::vector<double>>() : std::vector<double>{v.get<double>()};
}

std::shared_ptr<accel::ExactScheduler> make(const nlohmann::json& spec, torch::optim::Optimizer& opt) {
  const std::string k = spec["kind"];
  const auto& p = spec["params"];
  const auto last =
      p.value("last_epoch", std::int64_t(-1));  // >= 0: resumed by index (a "prior" set the initial rates)
  if (k == "StepLR")
    return std::make_shared<accel::StepLR>(
        opt, accel::StepLROptions{.step_size = p["step_size"], .gamma = p["gamma"], .last_epoch = last});
  if (k == "MultiStepLR")
    return std::make_shared<accel::MultiStepLR>(
        opt, accel::MultiStepLROptions{.milestones = p["milestones"], .gamma = p["gamma"], .last_epoch = last});
  if (k == "ConstantLR")
    return std::make_shared<accel::ConstantLR>(
        opt, accel::ConstantLROptions{.factor = p["factor"], .total_iters = p["total_iters"], .last_epoch = last});
  if (k == "ExponentialLR")
    return std::make_shared<accel::ExponentialLR>(opt,
                                                  accel::ExponentialLROptions{.gamma = p["gamma"], .last_epoch = last});
  if (k == "LinearLR")
    return std::make_shared<accel::LinearLR>(opt, accel::LinearLROptions{.start_factor = p["start_factor"],
                                                                         .end_factor = p["end_factor"],
                                                                         .total_iters = p["total_iters"],
                                                                         .last_epoch = last});
  if (k == "PolynomialLR")
    return std::make_shared<accel::PolynomialLR>(
        opt, accel::PolynomialLROptions{.total_iters = p["total_iters"], .power = p["power"], .last_epoch = last});
  if (k == "CosineAnnealingLR")
    return std::make_shared<accel::CosineAnnealingLR>(
        opt, accel::CosineAnnealingLROptions{.T_max = p["T_max"], .eta_min = p["eta_min"], .last_epoch = last});
  if (k == "CosineAnnealingWarmRestarts")
    return std::make_shared<accel::CosineAnnealingWarmRestarts>(
        opt, accel::CosineAnnealingWarmRestartsOptions{
                 .T_0 = p["T_0"], .T_mult = p["T_mult"], .eta_min = p["eta_min"], .last_epoch = last});
  if (k == "CyclicLR") {
    const std::string mode = p["mode"];
    return std::make_shared<accel::CyclicLR>(
        opt, accel::CyclicLROptions{
                 .base_lr = many(p["base_lr"]),
                 .max_lr = many(p["max_lr"]),
                 .step_size_up = p["step_size_up"],
                 .step_size_down = p["step_size_down"].is_null()
                                       ? std::nullopt
                                       : std::optional<std::int64_t>(p["step_size_down"].get<std::int64_t>()),
                 .mode = mode == "triangular"    ? accel::CyclicMode::triangular
                         : mode == "triangular2" ? accel::CyclicMode::triangular2
                                                 : accel::CyclicMode::exp_range,
                 .gamma = p["gamma"],
                 .cycle_momentum = p["cycle_momentum"],
                 .base_momentum = many(p["base_momentum"]),
                 .max_momentum = many(p["max_momentum"])});
  }
  if (k == "LambdaLR" || k == "MultiplicativeLR") {
    const std::string fn = p["fn"];
    if (fn == "warmup_linear")
      return accel::linear_schedule_with_warmup(opt,
                                                {.num_warmup_steps = p["warmup"], .num_training_steps = p["total"]});
    if (fn == "warmup_cosine")
      return accel::cosine_schedule_with_warmup(
          opt, {.num_warmup_steps = p["warmup"], .num_training_steps = p["total"], .num_cycles = p["num_cycles"]});
    if (fn == "warmup_constant") return accel::constant_schedule_with_warmup(opt, {.num_warmup_steps = p["warmup"]});
    if (fn == "warmup_cosine_hard_restarts")
      return accel::cosine_with_hard_restarts_schedule_with_warmup(
          opt, {.num_warmup_steps = p["warmup"], .num_training_steps = p["total"], .num_cycles = p["num_cycles"]});
    if (fn == "warmup_polynomial")
      return accel::polynomial_decay_schedule_with_warmup(opt, {.num_warmup_steps = p["warmup"],
                                                                .num_training_steps = p["total"],
                                                                .lr_end = p["lr_end"],
                                                                .power = p["power"]});
    if (fn == "inverse_sqrt")
      return accel::inverse_sqrt_schedule(
          opt,
          {.num_warmup_steps = p["warmup"],
           .timescale = p["timescale"].is_null() ? std::nullopt
                                                 : std::optional<std::int64_t>(p["timescale"].get<std::int64_t>())});
    accel::LrLambdas fns{lambda_of(p, 0), lambda_of(p, 1)};
    if (fn == "mult_one") fns = lambda_of(p, 0);  // one function, repeated for every group
    if (k == "MultiplicativeLR")
      return std::make_shared<accel::MultiplicativeLR>(opt, accel::MultiplicativeLROptions{.lr_lambda = fns});
    return std::make_shared<accel::LambdaLR>(opt, accel::LambdaLROptions{.lr_lambda = fns});
  }
  if (k == "OneCycleLR") {
    return std::make_shared<accel::OneCycleLR>(
        opt, accel::OneCycleLROptions{
                 .max_lr = many(p["max_lr"]),
                 .total_steps = p["total_steps"],
                 .pct_start = p["pct_start"],
                 .anneal_strategy = p["anneal_strategy"] == "cos" ? accel::Anneal::cos : accel::Anneal::linear,
                 .cycle_momentum = p["cycle_momentum"],
                 .base_momentum = many(p["base_momentum"]),
                 .max_momentum = many(p["max_momentum"]),
                 .div_factor = p["div_factor"],
                 .final_div_factor = p["final_div_factor"],
                 .three_phase = p["three_phase"]});
  }
  if (k == "SequentialLR" || k == "ChainedScheduler") {
    std::vector<std::shared_ptr<accel::ExactScheduler>> subs;
    for (const auto& s : p["schedulers"]) subs.push_back(make(s, opt));
    if (k == "ChainedScheduler")
      return std::make_shared<accel::ChainedScheduler>(opt, accel::ChainedSchedulerOptions{.schedulers = subs});
    return std::make_shared<accel::SequentialLR>(
        opt, accel::SequentialLROptions{.schedulers = subs, .milestones = p["milestones"]});
  }
  FAIL("unknown scheduler " << k);
  return nullptr;
}

std::shared_ptr<accel::ReduceLROnPlateau> make_plateau(const nlohmann::json& p, torch::optim::Optimizer& opt) {
  const auto& m = p["min_lr"];
  return std::make_shared<accel::ReduceLROnPlateau>(
      opt, accel::ReduceLROnPlateauOptions{
               .mode = p["mode"] == "min" ? accel::PlateauMode::min : accel::PlateauMode::max,
               .factor = p["factor"],
               .patience = p["patience"],
               .threshold = p["threshold"],
               .threshold_mode = p["threshold_mode"] == "rel" ? accel::ThresholdMode::rel : accel::ThresholdMode::abs,
               .cooldown = p["cooldown"],
               .min_lr = m.is_array() ? m.get<std::vector<double>>() : std::vector<double>{m.get<double>()},
               .eps = p["eps"]});
}

//! A golden case's scheduler on a fresh Fixture, after its "prior" (kept alive, as in the generator) if it has one.
struct Built {
  Fixture f;
  std::shared_ptr<accel::ExactScheduler> prior, s;
  explicit Built(const nlohmann::json& c)
      : f(c.value("optimizer", "sgd")),
        prior(c.contains("prior") ? make(c["prior"], *f.opt) : nullptr),
        s(make(c, *f.opt)) {}
};

std::vector<nlohmann::json> cases_of(bool plateau) {
  std::vector<nlohmann::json> out;
  for (const auto& c : schedule_golden()["cases"])
    if ((c["kind"] == "ReduceLROnPlateau") == plateau) out.push_back(c);
  return out;
}

//! `body(case)` for every golden case of ReduceLROnPlateau (`plateau`) or of the others, named in failures;
//! `at_least` > 0: the file must hold that many.
template <class Body>
void for_each_case(bool plateau, std::size_t at_least, Body&& body) {
  const auto cases = cases_of(plateau);
  if (at_least > 0) REQUIRE(cases.size() >= at_least);
  for (const auto& c : cases) {
    INFO(c["name"].get<std::string>());
    body(c);
  }
}

//! `from`'s state loaded into `to` through bytes, as a checkpoint file carries it.
template <class From, class To>
void copy_state(const From& from, To& to) {
  torch::serialize::OutputArchive out;
  from.save(out);
  auto in = reread(out);
  to.load(in);
}

//! Rows of the case from `from` on, as stepped by `step(k)` (k: the step's index), compared exactly.
template <class Step>
void check_rows(const nlohmann::json& c, const Fixture& f, std::size_t from, Step&& step) {
  const auto want = c["lr"].get<Rows>();
  const bool has_momentum = c.contains("momentum");
  const auto want_m = has_momentum ? c["momentum"].get<Rows>() : Rows{};
  for (std::size_t k = from; k < want.size(); ++k) {
    if (k > from) step(k - 1);
    INFO("after step " << k);
    REQUIRE(f.lrs() == want[k]);  // bit equality: the same arithmetic as PyTorch's, in double
    if (has_momentum) REQUIRE(f.momenta() == want_m[k]);
  }
}

//! The golden StepLR(step_size 3, gamma 0.5) from the start.
const nlohmann::json* step_lr_3_half() {
  for (const auto& x : schedule_golden()["cases"])
    if (x["kind"] == "StepLR" && x["params"]["step_size"] == 3 && x["params"]["gamma"] == 0.5 && !x.contains("prior"))
      return &x;
  return nullptr;
}

}  // namespace

TEST_CASE("schedulers: every golden sequence of PyTorch's schedulers, bit for bit, and get_last_lr",
          "[schedulers][golden]") {
  for_each_case(false, 115, [](const nlohmann::json& c) {
    Built b(c);
    CHECK(b.s->last_epoch() == c["params"].value("last_epoch", std::int64_t(-1)) + 1);
    CHECK(b.s->get_last_lr() == b.f.lrs());
    check_rows(c, b.f, 0, [&](std::size_t) {
      b.s->step();
      REQUIRE(b.s->get_last_lr() == b.f.lrs());
    });
    CHECK(b.s->last_epoch() == c["last_epoch"].get<std::int64_t>());
  });
}

TEST_CASE("schedulers: a state saved mid-sequence, loaded into a fresh scheduler, goes on identically",
          "[schedulers][golden]") {
  for_each_case(false, 0, [](const nlohmann::json& c) {
    const std::size_t steps = c["steps"], cut = steps / 2 + 1;  // odd cuts land inside phases and between milestones
    Built a(c);
    for (std::size_t k = 0; k < cut; ++k) a.s->step();
    Built b(c);  // built first, then the states loaded (PyTorch's advice, and Accelerator::load_state's order)
    copy_state(*a.f.opt, *b.f.opt);
    copy_state(*a.s, *b.s);
    CHECK(b.s->last_epoch() == a.s->last_epoch());
    CHECK(b.s->get_last_lr() == a.s->get_last_lr());
    check_rows(c, b.f, cut, [&](std::size_t) { b.s->step(); });
  });
}

TEST_CASE("ReduceLROnPlateau: PyTorch's decisions (modes, thresholds, patience, cooldown, min_lr, eps) and its state",
          "[schedulers][golden]") {
  for_each_case(true, 12, [](const nlohmann::json& c) {
    const auto metrics = c["metrics"].get<std::vector<double>>();
    Fixture f("sgd");
    auto s = make_plateau(c["params"], *f.opt);
    check_rows(c, f, 0, [&](std::size_t k) {
      s->step(metrics[k]);
      REQUIRE(s->get_last_lr() == f.lrs());
    });
    CHECK(s->last_epoch() == c["last_epoch"].get<std::int64_t>());

    // resumed from the middle: best, bad epochs and the cooldown come back with it
    const std::size_t cut = metrics.size() / 2 + 1;
    Fixture g("sgd"), h("sgd");
    auto u = make_plateau(c["params"], *g.opt);
    for (std::size_t k = 0; k < cut; ++k) u->step(metrics[k]);
    auto v = make_plateau(c["params"], *h.opt);
    copy_state(*g.opt, *h.opt);
    copy_state(*u, *v);
    CHECK(v->best() == u->best());
    CHECK(v->num_bad_epochs() == u->num_bad_epochs());
    CHECK(v->cooldown_counter() == u->cooldown_counter());
    check_rows(c, h, cut, [&](std::size_t k) { v->step(metrics[k]); });
  });
}

TEST_CASE("ReduceLROnPlateau through AcceleratedScheduler: step(metric) forwarded, N times per step as in Accelerate",
          "[schedulers]") {
  accel::GradientState::instance().set_sync_gradients(true);
  const auto c = cases_of(true).front();
  const auto metrics = c["metrics"].get<std::vector<double>>();
  {  // one process: the golden sequence
    Fixture f("sgd");
    accel::AcceleratedScheduler<accel::ReduceLROnPlateau> s(make_plateau(c["params"], *f.opt), {},
                                                            {.num_processes = 1});
    check_rows(c, f, 0, [&](std::size_t k) { s.step(metrics[k]); });
    CHECK(s.steps() == std::int64_t(metrics.size()));
    // the wrapper saves the scheduler's own state: a fresh wrapper resumes from it
    Fixture g("sgd");
    accel::AcceleratedScheduler<accel::ReduceLROnPlateau> t(make_plateau(c["params"], *g.opt), {},
                                                            {.num_processes = 1});
    copy_state(s, t);
    CHECK(t->best() == s->best());
    CHECK(t->last_epoch() == s->last_epoch());
    CHECK(t.steps() == s.steps());
  }
  {  // two processes, batches per process: each metric is seen twice (Accelerate's loop passes the args through)
    Fixture f("sgd"), g("sgd");
    accel::AcceleratedScheduler<accel::ReduceLROnPlateau> s(make_plateau(c["params"], *f.opt), {},
                                                            {.num_processes = 2});
    auto direct = make_plateau(c["params"], *g.opt);
    for (double m : metrics) {
      s.step(m);
      direct->step(m);
      direct->step(m);
      REQUIRE(f.lrs() == g.lrs());
    }
    CHECK(s->last_epoch() == 2 * std::int64_t(metrics.size()));
    CHECK(f.lrs() != c["lr"].back().get<std::vector<double>>());  // it does differ from one process here
  }
}

TEST_CASE("OneCycleLR through AcceleratedScheduler: N steps per step stop at total_steps (Accelerate's guard)",
          "[schedulers]") {
  accel::GradientState::instance().set_sync_gradients(true);
  Fixture f("sgd");
  auto one = std::make_shared<accel::OneCycleLR>(*f.opt, accel::OneCycleLROptions{.max_lr = {1.0}, .total_steps = 7});
  accel::AcceleratedScheduler<accel::OneCycleLR> s(one, {}, {.num_processes = 3});
  s.step(), s.step();
  CHECK(one->last_epoch() == 6);
  s.step();  // 3 more would pass total_steps: PyTorch raises; Accelerate steps while _step_count <= total_steps
  CHECK(one->last_epoch() == 7);
  CHECK(one->step_count() == 8);
  CHECK_THROWS_WITH(one->step(), Catch::Contains("the specified number of total steps is 7"));
}

TEST_CASE("schedulers: LibTorch's StepLR changes the rate one step after PyTorch's; accel::StepLR does not",
          "[schedulers][golden]") {
  const nlohmann::json* c = step_lr_3_half();
  REQUIRE(c != nullptr);
  const auto want = (*c)["lr"].get<Rows>();
  Fixture f("sgd"), g("sgd");
  torch::optim::StepLR theirs(*f.opt, 3, 0.5);
  accel::StepLR ours(*g.opt, {.step_size = 3, .gamma = 0.5});
  int late = 0;
  for (std::size_t k = 1; k < want.size(); ++k) {
    theirs.step();
    ours.step();
    INFO("after step " << k);
    CHECK(g.lrs() == want[k]);
    // LibTorch decides from the step count before incrementing it: PyTorch's rate of step k arrives at step k+1
    CHECK(f.lrs() == want[k - 1]);
    late += f.lrs() != want[k];
  }
  CHECK(late == 13);  // every decay (steps 3, 6, ..., 39) is one step late
}

TEST_CASE("schedulers: errors name what is wrong", "[schedulers]") {
  Fixture f("sgd");
  auto one = [](std::int64_t) { return 1.0; };
  CHECK_THROWS_WITH(accel::LambdaLR(*f.opt, {.lr_lambda = {one, one, one}}), Catch::Contains("expected 2 functions"));
  auto a = std::make_shared<accel::StepLR>(*f.opt, accel::StepLROptions{.step_size = 2});
  CHECK_THROWS_WITH(accel::SequentialLR(*f.opt, {.schedulers = {a}, .milestones = {3}}),
                    Catch::Contains("one milestone fewer than schedulers"));
  Fixture g("sgd");
  auto elsewhere = std::make_shared<accel::StepLR>(*g.opt, accel::StepLROptions{.step_size = 2});
  CHECK_THROWS_WITH(accel::SequentialLR(*f.opt, {.schedulers = {a, elsewhere}, .milestones = {3}}),
                    Catch::Contains("same optimizer"));
  CHECK_THROWS_WITH(accel::ChainedScheduler(*f.opt, {.schedulers = {a, elsewhere}}), Catch::Contains("same optimizer"));
  CHECK_THROWS_WITH(accel::ChainedScheduler(*f.opt, {}), Catch::Contains("at least one scheduler"));
  CHECK_THROWS_WITH(accel::StepLR(*f.opt, {}), Catch::Contains("step_size must be positive (it is 0)"));
  CHECK_THROWS_WITH(accel::CosineAnnealingWarmRestarts(*f.opt, {.T_0 = 3, .T_mult = 0}),
                    Catch::Contains("T_mult must be an integer >= 1"));
  CHECK_THROWS_WITH(accel::ConstantLR(*f.opt, {.factor = 1.5}), Catch::Contains("factor must be in [0, 1]"));
  CHECK_THROWS_WITH(accel::polynomial_decay_schedule_with_warmup(*f.opt, {.num_training_steps = 5, .lr_end = 1.0}),
                    Catch::Contains("must be smaller than the initial lr"));
  torch::optim::LRScheduler& base = *std::make_shared<accel::ReduceLROnPlateau>(*g.opt);
  // LibTorch's step() is not virtual: through the base it throws at once, naming the fix (a direct or prepared
  // step() does not compile: tests/fail/plateau_step_without_metric.cpp)
  CHECK_THROWS_WITH(base.step(), Catch::Contains("call step(metric) on the scheduler or on its AcceleratedScheduler"));
  std::vector<at::Tensor> p{at::zeros({1}).requires_grad_()};
  torch::optim::Adagrad adagrad(p, torch::optim::AdagradOptions(0.1));
  CHECK_THROWS_WITH(accel::OneCycleLR(adagrad, {.max_lr = {1.0}, .total_steps = 5}), Catch::Contains("cycle_momentum"));
  CHECK_NOTHROW(accel::OneCycleLR(adagrad, {.max_lr = {1.0}, .total_steps = 5, .cycle_momentum = false}));
  CHECK_THROWS_WITH(accel::CyclicLR(adagrad, {.base_lr = {0.1}, .max_lr = {1.0}}), Catch::Contains("cycle_momentum"));
  Fixture h("sgd");  // no scheduler has set its initial rates: PyTorch's KeyError for 'initial_lr'
  CHECK_THROWS_WITH(accel::StepLR(*h.opt, {.step_size = 3, .gamma = 0.5, .last_epoch = 4}),
                    Catch::Contains("needs the groups' initial rates"));
  static_assert(accel::TorchScheduler<accel::ReduceLROnPlateau> && accel::SavesState<accel::ReduceLROnPlateau>);
  static_assert(accel::TorchScheduler<accel::SequentialLR> && accel::SavesState<accel::OneCycleLR>);
  static_assert(!accel::SavesState<torch::optim::StepLR>);
}

namespace {
// Trains Net with SGD (fc1 at 0.1, fc2 at 0.03: the golden file's two groups) and accel::StepLR(3, 0.5), prepared
// by the Accelerator; returns the rates after each optimizer step. `stop_after` > 0: save there and stop.
Rows train_with_schedule(std::int64_t stop_after, const std::string& save_dir, const std::string& resume_dir) {
  Solo acc{accel::Options{.seed = 5}};
  Net net;
  std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup(net->fc1->parameters()),
                                                        torch::optim::OptimizerParamGroup(net->fc2->parameters())};
  auto sgd = std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1).momentum(0.9));
  sgd->param_groups()[1].options().set_lr(0.03);
  auto [model, opt, loader, sched] =
      acc.prepare(net, sgd, accel::data::DataLoader(toy_data(64), {.batch_size = 4}),
                  std::make_shared<accel::StepLR>(*sgd, accel::StepLROptions{.step_size = 3, .gamma = 0.5}));
  static_assert(std::is_same_v<decltype(sched), accel::AcceleratedScheduler<accel::StepLR>>);
  if (!resume_dir.empty()) acc.load_state(resume_dir);
  Rows out;
  for (const auto& batch : loader) {  // a resumed loader starts after the batches the saved job had seen
    auto step = acc.accumulate(model);
    acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
    opt.step();
    sched.step();
    opt.zero_grad();
    out.push_back(sched->get_last_lr());
    if (std::int64_t(out.size()) == stop_after) {
      acc.save_state(save_dir);
      break;
    }
  }
  return out;
}
}  // namespace

TEST_CASE("schedulers: prepared by the Accelerator, stepped with the optimizer, checkpointed and resumed",
          "[schedulers][accelerator]") {
  accel::ProcessState::reset();
  const nlohmann::json* c = step_lr_3_half();
  REQUIRE(c != nullptr);
  const auto want = (*c)["lr"].get<Rows>();
  const auto straight = train_with_schedule(0, "", "");
  REQUIRE(straight.size() == 16);
  for (std::size_t k = 0; k < straight.size(); ++k) CHECK(straight[k] == want[k + 1]);

  const auto dir = std::filesystem::temp_directory_path() / ("accel_sched_" + std::to_string(::getpid()));
  train_with_schedule(7, dir.string(), "");
  const auto resumed = train_with_schedule(0, "", dir.string());
  REQUIRE(resumed.size() == straight.size() - 7);
  for (std::size_t k = 0; k < resumed.size(); ++k) CHECK(resumed[k] == straight[k + 7]);
  std::filesystem::remove_all(dir);
}

namespace {
// `s`'s saved state with the field `key` replaced by `value` (a state from elsewhere), as an archive to load.
template <class Scheduler>
torch::serialize::InputArchive forged_state(const Scheduler& s, const std::string& key, const c10::IValue& value) {
  torch::serialize::OutputArchive out;
  s.save(out);
  auto saved = reread(out);
  auto changed = with_value(saved, key, value);
  return reread(changed);
}
}  // namespace

TEST_CASE("schedulers: a saved state outside what the constructor accepts is refused naming the field, nothing changed",
          "[schedulers]") {
  Fixture f("sgd");
  accel::StepLR step(*f.opt, {.step_size = 3, .gamma = 0.5});
  step.step();
  const auto epoch = step.last_epoch();
  const auto lrs = step.get_last_lr();
  auto refused = [&](auto& s, const std::string& key, const c10::IValue& value, const std::string& message) {
    auto in = forged_state(s, key, value);
    CHECK_THROWS_WITH(s.check(in), Catch::Contains(message));
    auto again = forged_state(s, key, value);
    CHECK_THROWS_WITH(s.load(again), Catch::Contains(message));
  };
  // A step size of 0 divides by zero at the next step; negative counters; a rate list of another length.
  refused(step, "step_size", std::int64_t(0), "scheduler state 'step_size' is 0, outside [1, ");
  refused(step, "last_epoch", std::int64_t(-5), "'last_epoch' is -5, outside [-1, ");
  refused(step, "step_count", std::int64_t(-1), "'step_count' is -1, outside [0, ");
  refused(step, "gamma", std::nan(""), "'gamma' is nan");
  refused(step, "base_lrs", c10::IValue(std::vector<double>{0.1}), "'base_lrs' has 1 values, this scheduler 2");
  CHECK(step.last_epoch() == epoch);  // check puts back the state it tried; load checks before it assigns
  CHECK(step.get_last_lr() == lrs);
  accel::CosineAnnealingLR cosine(*f.opt, {.T_max = 4});
  refused(cosine, "T_max", std::int64_t(0), "'T_max' is 0");
  accel::OneCycleLR cycle(*f.opt, {.max_lr = {1.0}, .total_steps = 5});
  refused(cycle, "pct_start", 1.5, "'pct_start' is 1.5, outside [0, 1]");
  refused(cycle, "max_momentum", c10::IValue(std::vector<double>{}), "'max_momentum' has 0 values, this scheduler 2");
  Fixture g("sgd");
  accel::ReduceLROnPlateau plateau(*g.opt);
  refused(plateau, "factor", 1.0, "'factor' is 1");
  refused(plateau, "num_bad_epochs", std::int64_t(-2), "'num_bad_epochs' is -2");
  auto a = std::make_shared<accel::StepLR>(*g.opt, accel::StepLROptions{.step_size = 2});
  auto b = std::make_shared<accel::StepLR>(*g.opt, accel::StepLROptions{.step_size = 3});
  accel::SequentialLR sequence(*g.opt, {.schedulers = {a, b}, .milestones = {4}});
  refused(sequence, "milestones", c10::IValue(std::vector<std::int64_t>{}),
          "'milestones' has 0 values, this scheduler 1");
  // A valid but different state loads.
  auto other = forged_state(step, "step_size", std::int64_t(7));
  CHECK_NOTHROW(step.load(other));
}

TEST_CASE("schedulers: LibTorch's scheduler counters are range-checked in the type they are read into",
          "[schedulers]") {
  Fixture f("sgd");
  accel::AcceleratedScheduler<torch::optim::StepLR> wrapped(std::make_shared<torch::optim::StepLR>(*f.opt, 3, 0.5), {},
                                                            {});
  auto refused = [&](const std::string& key, std::int64_t value, const std::string& message) {
    auto in = forged_state(wrapped, key, value);
    CHECK_THROWS_WITH(wrapped.check(in), Catch::Contains(message));
    auto again = forged_state(wrapped, key, value);
    CHECK_THROWS_WITH(wrapped.load(again), Catch::Contains(message));
  };
  refused("step_count", -1, "scheduler state 'step_count' is -1, outside [0, 4294967295]");
  refused("step_count", std::int64_t(1) << 40, "'step_count' is 1099511627776, outside [0, 4294967295]");
  refused("accel_steps", -5, "'accel_steps' is -5, outside [0, ");
  auto fine = forged_state(wrapped, "step_count", std::int64_t(4));
  CHECK_NOTHROW(wrapped.load(fine));
}

namespace {
// A scheduler of one's own, written with public names only (ExactScheduler's documented interface): PyTorch's
// ExponentialLR again, chainable, with a closed form and its gamma saved.
class MyExponential : public accel::ExactScheduler {
 public:
  MyExponential(torch::optim::Optimizer& opt, double gamma) : accel::ExactScheduler(opt, -1), gamma_(gamma) {
    initial_step();
  }

 protected:
  std::vector<double> get_lr() override {
    if (is_initial_step()) return current_lrs();
    return accel::scaled(current_lrs(), gamma_);
  }
  [[nodiscard]] std::optional<std::vector<double>> closed_form_lr() const override {
    return accel::scaled(base_lrs(), std::pow(gamma_, double(last_epoch())));
  }
  void fields(accel::StateIO& io) override {
    accel::ExactScheduler::fields(io);
    io("gamma", gamma_, accel::Bounds<double>{0.0, 1.0});
  }

 private:
  double gamma_;
};
}  // namespace

TEST_CASE("schedulers: a scheduler of one's own, from public names only, steps, restarts and saves as PyTorch's",
          "[schedulers][golden]") {
  const nlohmann::json* golden = nullptr;
  for (const auto& c : schedule_golden()["cases"])
    if (c["kind"] == "ExponentialLR" && c["params"]["gamma"] == 0.95) golden = &c;
  REQUIRE(golden != nullptr);
  Fixture f("sgd");
  auto mine = std::make_shared<MyExponential>(*f.opt, 0.95);
  check_rows(*golden, f, 0, [&](std::size_t) { mine->step(); });
  // its state: saved and loaded, the gamma range-checked
  Fixture g("sgd");
  MyExponential other(*g.opt, 0.5);
  copy_state(*f.opt, *g.opt);
  copy_state(*mine, other);
  CHECK(other.last_epoch() == mine->last_epoch());
  other.step(), mine->step();
  CHECK(g.lrs() == f.lrs());
  auto forged = forged_state(other, "gamma", 2.0);
  CHECK_THROWS_WITH(other.load(forged), Catch::Contains("'gamma' is 2, outside [0, 1]"));
  // in a SequentialLR, restarted from its closed form at the milestone
  Fixture h("sgd"), k("sgd");
  auto warm = [](torch::optim::Optimizer& o) {
    return std::make_shared<accel::LinearLR>(o, accel::LinearLROptions{.start_factor = 0.5, .total_iters = 3});
  };
  auto w1 = warm(*h.opt);
  accel::SequentialLR seq_mine(*h.opt,
                               {.schedulers = {w1, std::make_shared<MyExponential>(*h.opt, 0.9)}, .milestones = {3}});
  auto w2 = warm(*k.opt);
  accel::SequentialLR seq_torch(
      *k.opt,
      {.schedulers = {w2, std::make_shared<accel::ExponentialLR>(*k.opt, accel::ExponentialLROptions{.gamma = 0.9})},
       .milestones = {3}});
  for (int i = 0; i < 10; ++i) {
    seq_mine.step(), seq_torch.step();
    REQUIRE(h.lrs() == k.lrs());
  }
}

TEST_CASE("schedule_steps: the steps a prepared scheduler takes over a run (processes, accumulation, split batches)",
          "[schedulers][accelerator]") {
  CHECK(accel::schedule_steps(std::int64_t(13), 3, 4, 1) == 3 * 4);  // ceil(13 / 4) = 4 optimizer steps per epoch
  CHECK(accel::schedule_steps(std::int64_t(13), 3, 4, 2) == 3 * 4 * 2);
  CHECK(accel::schedule_steps(std::int64_t(13), 3, 4, 2, true) == 3 * 4);
  CHECK(accel::schedule_steps(std::int64_t(12), 2, 1, 8) == 2 * 12 * 8);
  CHECK_THROWS_WITH(accel::schedule_steps(std::int64_t(12), 2, 0, 1), Catch::Contains("accumulation_steps"));

  // One process: a prepared scheduler stepped after every optimizer.step() of a real loop with accumulation.
  for (int accumulation : {1, 3, 4}) {
    accel::ProcessState::reset();
    Solo acc{accel::Options{.seed = 5, .gradient_accumulation_steps = accumulation}};
    Net net;
    auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt, loader] = acc.prepare(net, sgd, accel::data::DataLoader(toy_data(50), {.batch_size = 4}));
    const std::int64_t epochs = 2;
    const auto expected = acc.schedule_steps(loader, epochs);
    CHECK(expected == accel::schedule_steps(loader, epochs, accumulation, 1));
    auto sched = acc.prepare(
        std::make_shared<accel::LambdaLR>(*sgd, accel::LambdaLROptions{.lr_lambda = [](std::int64_t) { return 1.0; }}));
    for (std::int64_t e = 0; e < epochs; ++e)
      for (const auto& batch : loader) {
        auto step = acc.accumulate(model);
        acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        opt.step();
        sched.step();
        opt.zero_grad();
      }
    INFO("accumulation " << accumulation);
    CHECK(sched->last_epoch() == expected);
    CHECK(sched.steps() == expected);
  }
  // N processes: AcceleratedScheduler, as prepare builds it, steps N times per synchronised optimizer step (once
  // with split batches); the optimizer steps are the synchronised ones of the loop above.
  for (bool split : {false, true}) {
    Fixture f("sgd");
    accel::AcceleratedScheduler<accel::StepLR> s(
        std::make_shared<accel::StepLR>(*f.opt, accel::StepLROptions{.step_size = 1000}), {},
        {.num_processes = 3, .split_batches = split});
    const std::int64_t batches = 10, accumulation = 4, epochs = 2;
    for (std::int64_t e = 0; e < epochs; ++e)
      for (std::int64_t b = 0; b < batches; ++b) {
        accel::GradientState::instance().set_sync_gradients((b + 1) % accumulation == 0 || b + 1 == batches);
        s.step();
      }
    accel::GradientState::instance().set_sync_gradients(true);
    CHECK(s->last_epoch() == accel::schedule_steps(batches, epochs, accumulation, 3, split));
  }
}

namespace {

template <class T>
T& deref(T& s) {
  return s;
}
template <class T>
T& deref(std::shared_ptr<T>& s) {
  return *s;
}

//! The scheduler `old_form` builds (a positional spelling of earlier versions) and the one `new_form` builds (its
//! options form), each on a fresh optimizer of `kind`, give the same rates and momenta after construction and after
//! each of `steps` steps, bit for bit; and the rates change on the way.
template <class Old, class New>
void same_as_options_form(const std::string& what, Old old_form, New new_form, const std::string& kind = "sgd",
                          int steps = 12) {
  INFO(what);
  Fixture a(kind), b(kind);
  const auto initial = a.lrs();
  auto s_old = old_form(*a.opt);
  auto s_new = new_form(*b.opt);
  bool changed = false;
  for (int k = 0; k <= steps; ++k) {
    INFO("after step " << k);
    if (k > 0) deref(s_old).step(), deref(s_new).step();
    REQUIRE(a.lrs() == b.lrs());
    REQUIRE(a.momenta() == b.momenta());
    REQUIRE(deref(s_old).get_last_lr() == deref(s_new).get_last_lr());
    changed = changed || a.lrs() != initial;
  }
  CHECK(changed);
}

}  // namespace

TEST_CASE("schedulers: the positional spellings of earlier versions compile and give their options form's rates",
          "[schedulers]") {
  using Opt = torch::optim::Optimizer;
  using accel::OneCycleLROptions;
  same_as_options_form(
      "StepLR(opt, step_size, gamma)", [](Opt& o) { return std::make_shared<accel::StepLR>(o, 3, 0.5); },
      [](Opt& o) { return accel::StepLR(o, {.step_size = 3, .gamma = 0.5}); });
  same_as_options_form(
      "StepLR(opt, step_size)", [](Opt& o) { return accel::StepLR(o, 2); },
      [](Opt& o) { return accel::StepLR(o, {.step_size = 2}); });
  same_as_options_form(
      "MultiStepLR(opt, {milestones}, gamma)",
      [](Opt& o) {
        return accel::MultiStepLR(o, {2, 5, 5}, 0.5);
      },
      [](Opt& o) {
        return accel::MultiStepLR(o, {.milestones = {2, 5, 5}, .gamma = 0.5});
      });
  same_as_options_form(
      "MultiStepLR(opt, milestones)",
      [](Opt& o) { return std::make_shared<accel::MultiStepLR>(o, std::vector<std::int64_t>{4}); },
      [](Opt& o) { return accel::MultiStepLR(o, {.milestones = {4}}); });
  same_as_options_form(
      "ExponentialLR(opt, gamma)", [](Opt& o) { return std::make_shared<accel::ExponentialLR>(o, 0.9); },
      [](Opt& o) { return accel::ExponentialLR(o, {.gamma = 0.9}); });
  same_as_options_form(
      "LinearLR(opt, start, end, total_iters)",
      [](Opt& o) { return std::make_shared<accel::LinearLR>(o, 0.25, 1.0, 4); },
      [](Opt& o) { return accel::LinearLR(o, {.start_factor = 0.25, .end_factor = 1.0, .total_iters = 4}); });
  same_as_options_form(
      "LinearLR(opt)", [](Opt& o) { return accel::LinearLR(o); }, [](Opt& o) { return accel::LinearLR(o, {}); });
  same_as_options_form(
      "LinearLR(opt, {}): the options form, PyTorch's defaults", [](Opt& o) { return accel::LinearLR(o, {}); },
      [](Opt& o) { return accel::LinearLR(o, accel::LinearLROptions{.start_factor = 1.0 / 3}); });
  same_as_options_form(
      "CosineAnnealingLR(opt, T_max, eta_min)",
      [](Opt& o) { return std::make_shared<accel::CosineAnnealingLR>(o, 5, 0.001); },
      [](Opt& o) { return accel::CosineAnnealingLR(o, {.T_max = 5, .eta_min = 0.001}); });
  same_as_options_form(
      "OneCycleLR(opt, {max_lr}, {...}) with beta1 cycling",
      [](Opt& o) {
        return accel::OneCycleLR(o, {0.1, 0.05}, {.total_steps = 12, .three_phase = true});
      },
      [](Opt& o) {
        return accel::OneCycleLR(o, OneCycleLROptions{.max_lr = {0.1, 0.05}, .total_steps = 12, .three_phase = true});
      },
      "adamw");
  same_as_options_form(
      "OneCycleLR(opt, max_lr, OneCycleOptions) with momentum cycling",
      [](Opt& o) {
        accel::OneCycleOptions oc{12};  // total_steps: the first field, as it was
        oc.anneal_strategy = accel::Anneal::linear;
        return std::make_shared<accel::OneCycleLR>(o, std::vector<double>{0.2}, oc);
      },
      [](Opt& o) {
        return accel::OneCycleLR(
            o, OneCycleLROptions{.max_lr = {0.2}, .total_steps = 12, .anneal_strategy = accel::Anneal::linear});
      });
  const auto decay = [](std::int64_t e) { return std::pow(0.9, double(e)); };
  const auto inverse = [](std::int64_t e) { return 1.0 / (1.0 + double(e)); };
  same_as_options_form(
      "LambdaLR(opt, fn)", [&](Opt& o) { return std::make_shared<accel::LambdaLR>(o, decay); },
      [&](Opt& o) { return accel::LambdaLR(o, {.lr_lambda = decay}); });
  same_as_options_form(
      "LambdaLR(opt, std::function)", [&](Opt& o) { return accel::LambdaLR(o, accel::LambdaLR::Fn(decay)); },
      [&](Opt& o) { return accel::LambdaLR(o, {.lr_lambda = decay}); });
  same_as_options_form(
      "LambdaLR(opt, {fn0, fn1})",
      [&](Opt& o) {
        return accel::LambdaLR(o, {decay, inverse});
      },
      [&](Opt& o) {
        return accel::LambdaLR(o, {.lr_lambda = {decay, inverse}});
      });
  same_as_options_form(
      "LambdaLR(opt, {fn}): the options form", [&](Opt& o) { return accel::LambdaLR(o, {decay}); },
      [&](Opt& o) { return accel::LambdaLR(o, {.lr_lambda = decay}); });
  same_as_options_form(
      "SequentialLR(opt, {s0, s1}, milestones)",
      [](Opt& o) {
        auto s0 = std::make_shared<accel::LinearLR>(o, 0.5, 1.0, 3);
        auto s1 = std::make_shared<accel::ExponentialLR>(o, 0.9);
        const std::vector<std::int64_t> milestones{3};
        return accel::SequentialLR(o, {s0, s1}, milestones);
      },
      [](Opt& o) {
        auto s0 = std::make_shared<accel::LinearLR>(o, accel::LinearLROptions{.start_factor = 0.5, .total_iters = 3});
        auto s1 = std::make_shared<accel::ExponentialLR>(o, accel::ExponentialLROptions{.gamma = 0.9});
        return accel::SequentialLR(o, {.schedulers = {s0, s1}, .milestones = {3}});
      });
  same_as_options_form(
      "constant_schedule_with_warmup(opt, warmup)", [](Opt& o) { return accel::constant_schedule_with_warmup(o, 4); },
      [](Opt& o) { return accel::constant_schedule_with_warmup(o, {.num_warmup_steps = 4}); });
  same_as_options_form(
      "linear_schedule_with_warmup(opt, warmup, total)",
      [](Opt& o) { return accel::linear_schedule_with_warmup(o, 3, 10); },
      [](Opt& o) { return accel::linear_schedule_with_warmup(o, {.num_warmup_steps = 3, .num_training_steps = 10}); });
  same_as_options_form(
      "cosine_schedule_with_warmup(opt, warmup, total, cycles)",
      [](Opt& o) { return accel::cosine_schedule_with_warmup(o, 2, 12, 1.5); },
      [](Opt& o) {
        return accel::cosine_schedule_with_warmup(o,
                                                  {.num_warmup_steps = 2, .num_training_steps = 12, .num_cycles = 1.5});
      });
  same_as_options_form(
      "cosine_schedule_with_warmup(opt, warmup, total)",
      [](Opt& o) { return accel::cosine_schedule_with_warmup(o, 2, 12); },
      [](Opt& o) { return accel::cosine_schedule_with_warmup(o, {.num_warmup_steps = 2, .num_training_steps = 12}); });

  // A braced second argument alone is the options form, not ambiguous with a positional spelling.
  Fixture f("sgd");
  const auto initial = f.lrs();
  accel::MultiStepLR none(*f.opt, {});
  none.step(), none.step();
  CHECK(f.lrs() == initial);
  CHECK_THROWS_WITH(accel::OneCycleLR(*f.opt, {}), Catch::Contains("max_lr must have one value"));
  // the positional list of functions is one per group, as it was
  CHECK_THROWS_WITH(accel::LambdaLR(*f.opt, std::vector<accel::LambdaLR::Fn>{[](std::int64_t) { return 1.0; }}),
                    Catch::Contains("expected 2 functions (one per group), got 1"));

  // ReduceLROnPlateau(opt, {...}) was an options form already: the former struct name and the braces still work.
  Fixture g("sgd"), h("sgd"), k("sgd");
  accel::ReduceLROnPlateau braced(*g.opt, {.mode = accel::PlateauMode::max, .factor = 0.5, .patience = 1});
  accel::ReduceLROnPlateau named(*h.opt,
                                 accel::PlateauOptions{.mode = accel::PlateauMode::max, .factor = 0.5, .patience = 1});
  accel::ReduceLROnPlateau defaults(*k.opt);
  for (double metric : {1.0, 2.0, 1.5, 1.5, 1.5, 3.0, 2.0, 2.0}) {
    braced.step(metric), named.step(metric), defaults.step(metric);
    REQUIRE(g.lrs() == h.lrs());
  }
  CHECK(g.lrs() != initial);
  CHECK(k.lrs() == initial);  // patience 10
}
