// The checkpoint policy (checkpoint/project.hpp), custom state (checkpoint/custom.hpp) and preemption
// (state/preemption.hpp) through the Accelerator, on one process.
#include "../../support/files.hpp"
#include "../support.hpp"
#include "../training_support.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace accel_test;

namespace {

namespace fs = std::filesystem;

accel::ProjectConfiguration project_in(const fs::path& dir, std::optional<int> limit = std::nullopt) {
  return {.project_dir = dir, .automatic_checkpoint_naming = true, .total_limit = limit};
}

//! What a toy job does at each batch: nothing, save_state(), or raise a signal.
enum class At { nothing, save, signal };

//! Trains Net on the toy data (Adam, 2-step accumulation, shuffled loader) for `epochs` epochs; `at(batch)` says
//! what happens after batch `batch` (counted from 1 over the whole run). Resumes from the latest checkpoint
//! first when `resume`. `sampled`: the batches come from a batch sampler of the user's (rotated every epoch).
//! Returns the final parameters.
template <class At_>
std::vector<at::Tensor> train_project(accel::Options o, int epochs, bool resume, At_ at, bool sampled = false) {
  o.seed = resume ? 1234 : 11;  // a resumed job must take everything from the checkpoint
  o.gradient_accumulation_steps = 2;
  Solo acc{o};
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  accel::data::DataLoaderOptions lo{.batch_size = 8, .shuffle = !sampled};
  if (sampled)
    lo.batch_sampler = [](std::int64_t epoch) {
      std::vector<std::vector<std::int64_t>> batches(5);
      for (std::int64_t i = 0; i < 40; ++i) batches[std::size_t(i / 8)].push_back((i + 3 * epoch) % 40);
      return batches;
    };
  auto [model, opt, loader] = acc.prepare(net, adam, accel::data::DataLoader(toy_data(40), lo));
  if (resume) acc.load_state();
  std::int64_t seen = 0;
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    for (const auto& batch : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      opt.step();
      opt.zero_grad();
      switch (at(++seen)) {
        case At::save:
          (void)acc.save_state();
          break;
        case At::signal:
          std::raise(SIGUSR1);
          break;
        case At::nothing:
          break;
      }
    }
  }
  return snapshot_of(net);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("project: checkpoint_<n> names, parsed strictly", "[checkpoint][project]") {
  using accel::checkpoint::checkpoint_number;
  CHECK(checkpoint_number("checkpoint_0") == 0);
  CHECK(checkpoint_number("checkpoint_12") == 12);
  for (const char* other : {"checkpoint_", "checkpoint_3.partial", "checkpoint_3.old", "checkpoint_-1", "checkpoint_+1",
                            "checkpoint_1a", "ckpt_1", "checkpoint_99999999999999999999"})
    CHECK_FALSE(checkpoint_number(other).has_value());
}

TEST_CASE(
    "project: save_state() numbers checkpoints, keeps total_limit complete ones, and load_state() resumes the latest",
    "[accelerator][checkpoint][project]") {
  accel::ProcessState::reset();
  const auto dir = test_files::scratch("project", "policy");
  const auto straight = train_project({}, 3, false, [](std::int64_t) { return At::nothing; });
  // 15 batches: checkpoints after batches 4, 8 and 12 (the last one mid-epoch 2), at most 2 kept.
  (void)train_project({.project_config = project_in(dir, 2)}, 3, false,
                      [](std::int64_t b) { return b % 4 == 0 && b <= 12 ? At::save : At::nothing; });
  CHECK(names_in(dir / "checkpoints") == std::vector<std::string>{"checkpoint_1", "checkpoint_2"});
  // Leftovers of an interrupted save and a folder without a manifest are never chosen.
  fs::create_directories(dir / "checkpoints" / "checkpoint_9.partial");
  fs::create_directories(dir / "checkpoints" / "checkpoint_7");
  CHECK(accel::checkpoint::latest_checkpoint(project_in(dir))->number == 2);

  SECTION("a fresh job resumes from the latest complete checkpoint and ends as if it never stopped") {
    check_equal(
        train_project({.project_config = project_in(dir, 2)}, 3, true, [](std::int64_t) { return At::nothing; }),
        straight);
  }
  SECTION("the resumed job numbers after the latest checkpoint and prunes after its new one is complete") {
    (void)train_project({.project_config = project_in(dir, 2)}, 3, true,
                        [](std::int64_t b) { return b == 1 ? At::save : At::nothing; });
    CHECK(names_in(dir / "checkpoints") ==
          std::vector<std::string>{"checkpoint_2", "checkpoint_3", "checkpoint_7"});  // and no .partial
  }
  SECTION("a fresh job that does not resume cannot overwrite or outnumber the project's checkpoints") {
    CHECK_THROWS_WITH(train_project({.project_config = project_in(dir)}, 1, false,
                                    [](std::int64_t b) { return b == 1 ? At::save : At::nothing; }),
                      Catch::Contains("the project holds checkpoints up to") && Catch::Contains("checkpoint_2") &&
                          Catch::Contains("resume with load_state() first"));
  }
  SECTION("without automatic naming, or without a checkpoint, the calls without a directory say what to do") {
    Solo acc;
    CHECK_THROWS_WITH(acc.save_state(),
                      Catch::Contains("automatic_checkpoint_naming is off") && Catch::Contains("pass a directory"));
    CHECK_THROWS_WITH(acc.load_state(), Catch::Contains("automatic_checkpoint_naming is off"));
    Solo empty{accel::Options{.project_config = project_in(test_files::scratch("project", "empty"))}};
    CHECK_FALSE(empty.latest_checkpoint().has_value());
    CHECK_THROWS_WITH(empty.load_state(),
                      Catch::Contains("no complete checkpoint under") && Catch::Contains("latest_checkpoint()"));
  }
  SECTION("a configuration that keeps nothing is refused") {
    CHECK_THROWS_WITH(Solo(accel::Options{.project_config = project_in(dir, 0)}),
                      Catch::Contains("total_limit is 0") && Catch::Contains("keep at least 1 checkpoint"));
    CHECK_THROWS_WITH(Solo(accel::Options{.preemption = {.enabled = true}}),
                      Catch::Contains("automatic_checkpoint_naming = true"));
  }
  fs::remove_all(dir.parent_path());
}

TEST_CASE("project: trackers write under the project's logging_dir, else its project_dir", "[accelerator][project]") {
  accel::ProcessState::reset();
  const auto dir = test_files::scratch("project", "logs");
  CHECK(Solo(accel::Options{.project_config = {.project_dir = dir}}).logging_dir() == dir);
  CHECK(Solo(accel::Options{.project_config = {.project_dir = dir, .logging_dir = dir / "logs"}}).logging_dir() ==
        dir / "logs");
  CHECK(Solo(accel::Options{.logging_dir = "elsewhere", .project_config = {.project_dir = dir}}).logging_dir() ==
        "elsewhere");
  CHECK(Solo().logging_dir() == ".");
  fs::remove_all(dir.parent_path());
}

namespace {
// The three ways to be checkpointable (checkpoint/custom.hpp).
struct Counters {  // serialisable itself
  std::int64_t steps = 0;
  double best = 0;
  std::map<std::string, std::int64_t> seen;
};
auto accel_fields(Counters& c) { return std::tie(c.steps, c.best, c.seen); }
auto accel_fields(const Counters& c) { return std::tie(c.steps, c.best, c.seen); }

struct Ema {  // state_dict / load_state_dict
  at::Tensor shadow = at::zeros({3});
  double decay = 0.9;
  [[nodiscard]] std::pair<at::Tensor, double> state_dict() const { return {shadow, decay}; }
  void load_state_dict(const std::pair<at::Tensor, double>& s) { shadow = s.first.clone(), decay = s.second; }
};
}  // namespace

TEST_CASE(
    "register_for_checkpointing: custom state is saved and restored in registration order; a mismatch is an error",
    "[accelerator][checkpoint][project]") {
  accel::ProcessState::reset();
  const auto dir = test_files::scratch("project", "custom");
  Counters counters{7, 0.25, {{"a", 1}, {"b", 2}}};
  Ema ema;
  ema.shadow = at::arange(3, at::kFloat);
  auto shared = std::make_shared<Counters>(Counters{1, 2, {}});
  torch::nn::Linear averaged(2, 2);  // a module (LibTorch's archive protocol)
  const auto weights = averaged->weight.detach().clone();
  {
    Solo acc;
    acc.register_for_checkpointing(counters, ema, shared, averaged);
    acc.save_state(dir);
  }
  for (int i = 0; i < 4; ++i) CHECK(fs::exists(dir / ("custom_checkpoint_" + std::to_string(i) + ".pt")));
  counters = {};
  ema = {};
  *shared = {};
  {
    torch::NoGradGuard no_grad;
    averaged->weight.zero_();
  }
  SECTION("restored") {
    Solo acc;
    acc.register_for_checkpointing(counters, ema, shared, averaged);
    acc.load_state(dir);
    CHECK(counters.steps == 7);
    CHECK(counters.best == 0.25);
    CHECK(counters.seen == std::map<std::string, std::int64_t>{{"a", 1}, {"b", 2}});
    CHECK(at::equal(ema.shadow, at::arange(3, at::kFloat)));
    CHECK(shared->steps == 1);
    CHECK(at::equal(averaged->weight, weights));
  }
  SECTION("another number of objects") {
    Solo acc;
    acc.register_for_checkpointing(counters, ema);
    CHECK_THROWS_WITH(acc.load_state(dir),
                      Catch::Contains("holds 4 custom objects, this job registered 2") &&
                          Catch::Contains("register_for_checkpointing the same objects, in the same order"));
  }
  SECTION("another order: an error naming both types, and nothing restored") {
    Solo acc;
    acc.register_for_checkpointing(counters, shared, ema, averaged);
    CHECK_THROWS_WITH(acc.load_state(dir), Catch::Contains("custom object #1 of the checkpoint") &&
                                               Catch::Contains("Ema, this job registered a ") &&
                                               Catch::Contains("Counters there"));
    CHECK(counters.steps == 0);  // object #0 matched, yet nothing is restored before everything is checked
  }
  fs::remove_all(dir.parent_path());
}

TEST_CASE(
    "preemption: a signal saves a checkpoint at the next step boundary; the restarted job ends as if never stopped",
    "[accelerator][checkpoint][preemption]") {
  accel::ProcessState::reset();
  const auto dir = test_files::scratch("project", "preempt");
  const bool sampled = GENERATE(false, true);  // a shuffled loader, a batch sampler of the user's
  INFO((sampled ? "batch sampler" : "shuffled loader"));
  const auto straight = train_project(
      {}, 3, false, [](std::int64_t) { return At::nothing; }, sampled);
  const accel::Options preemptible{.project_config = project_in(dir), .preemption = {.enabled = true, .exit = false}};
  // 5 batches an epoch, 2-step accumulation: batch 6 (the first of epoch 1) is inside an accumulation window, so
  // the checkpoint waits for the optimizer step of batch 7; batch 10 ends epoch 1.
  const std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> saved_at{{6, {1, 2}},
                                                                               {10, {2, 0}}};  // epoch, batches handed
  for (const auto& [when, position] : saved_at) {
    INFO("signal after batch " << when);
    fs::remove_all(dir / "checkpoints");
    try {
      (void)train_project(
          preemptible, 3, false, [&](std::int64_t b) { return b == when ? At::signal : At::nothing; }, sampled);
      FAIL("the job was not stopped");
    } catch (const accel::Preempted& p) {
      CHECK(p.signal() == SIGUSR1);
      CHECK(p.checkpoint() == dir / "checkpoints" / "checkpoint_0");
    }
    CHECK(names_in(dir / "checkpoints") == std::vector<std::string>{"checkpoint_0"});
    {  // saved at the step boundary, not where the signal came
      const auto file = (dir / "checkpoints" / "checkpoint_0" / "process_0.pt").string();
      torch::serialize::InputArchive archive;
      archive.load_from(file);
      const auto record = accel::checkpoint::read_process_record(
          archive, file, accel::generator_bytes(at::detail::getDefaultCPUGenerator()).size());
      REQUIRE(record.loaders.size() == 1);
      CHECK(std::pair(record.loaders[0].epoch, record.loaders[0].batches) == position);
    }
    check_equal(train_project(
                    preemptible, 3, true, [](std::int64_t) { return At::nothing; }, sampled),
                straight);
  }
  // The handlers are the previous ones again once the accelerator is gone.
  struct sigaction now {};
  ::sigaction(SIGUSR1, nullptr, &now);
  CHECK(now.sa_handler == SIG_DFL);
  fs::remove_all(dir.parent_path());
}

TEST_CASE(
    "register_save_state_pre_hook: every save_state, the preemption save too, runs the hooks first, in order; "
    "what they put into a registered object is saved",
    "[accelerator][checkpoint][preemption]") {
  accel::ProcessState::reset();
  const auto dir = test_files::scratch("project", "hooks");
  Counters saved;  // the hook puts the batches seen into it
  std::int64_t batches = 0;
  std::vector<std::string> calls;
  auto job = [&](const accel::Options& o) {
    auto acc = std::make_unique<Solo>(o);
    Net net;
    auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, opt, loader] = acc->prepare(net, adam, accel::data::DataLoader(toy_data(40), {.batch_size = 8}));
    acc->register_for_checkpointing(saved);
    return std::tuple(std::move(acc), model, opt, loader);
  };
  {
    auto [acc, model, opt, loader] =
        job({.project_config = project_in(dir), .preemption = {.enabled = true, .exit = false}});
    acc->register_save_state_pre_hook([&](const fs::path& d) {
      calls.push_back("first " + d.filename().string());
      saved.steps = batches;
    });
    acc->register_save_state_pre_hook([&](const fs::path&) { calls.push_back("second"); });
    CHECK_THROWS_WITH(acc->register_save_state_pre_hook({}), Catch::Contains("an empty function"));
    (void)acc->save_state();
    try {
      for (const auto& batch : loader) {
        acc->backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        opt.step();
        opt.zero_grad();
        if (++batches == 3) std::raise(SIGUSR1);  // saved when the loop asks for batch 4
      }
      FAIL("the job was not stopped");
    } catch (const accel::Preempted& p) {
      CHECK(p.checkpoint() == dir / "checkpoints" / "checkpoint_1");
    }
  }
  CHECK(calls == std::vector<std::string>{"first checkpoint_0", "second", "first checkpoint_1", "second"});
  saved = {};
  auto [acc, model, opt, loader] = job({});
  acc->load_state(dir / "checkpoints" / "checkpoint_1");
  CHECK(saved.steps == 3);  // what the hook had set before the files were written
  fs::remove_all(dir.parent_path());
}
