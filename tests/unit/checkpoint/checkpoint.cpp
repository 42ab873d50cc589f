// Checkpoints (checkpoint/checkpointer.hpp, checkpoint/format.hpp) through the Accelerator: a fresh job that loads a
// mid-epoch checkpoint ends bit-identical to one that never stopped; a checkpoint of other objects is refused.
#include "../support.hpp"
#include "../training_support.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>

using namespace accel_test;

namespace {
// Trains Net on the toy data for `epochs` epochs with Adam, StepLR, 2-step accumulation and a shuffled loader.
// `stop_after` > 0: stop after that many batches overall and save to `save_dir`. `resume_dir`: load first.
std::vector<at::Tensor> train_toy(std::uint64_t seed, int epochs, std::int64_t stop_after, const std::string& save_dir,
                                  const std::string& resume_dir) {
  Solo acc{accel::Options{.seed = seed, .gradient_accumulation_steps = 2}};
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, opt, loader, sched] = acc.prepare(net, adam, accel::data::DataLoader(toy_data(70), {.batch_size = 8, .shuffle = true}),
                                                 std::make_shared<torch::optim::StepLR>(*adam, 3, 0.5));
  if (!resume_dir.empty()) acc.load_state(resume_dir);
  std::int64_t seen = 0;
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    for (const auto& batch : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      opt.step();
      sched.step();
      opt.zero_grad();
      if (++seen == stop_after) {
        acc.save_state(save_dir);
        return {};
      }
    }
  }
  return snapshot_of(net);
}
}  // namespace

TEST_CASE("resume: a fresh job that loads a mid-epoch checkpoint ends bit-identical to one that never stopped", "[accelerator][checkpoint]") {
  accel::ProcessState::reset();
  const auto dir = std::filesystem::temp_directory_path() / ("accel_resume_" + std::to_string(::getpid()));
  const auto straight = train_toy(11, 4, 0, "", "");
  for (std::int64_t cut : {5, 9, 13, 27}) {  // inside the 1st, 2nd, 2nd (epoch end) and 4th epochs; odd and even steps
    INFO("checkpoint after batch " << cut);
    train_toy(11, 4, cut, dir.string(), "");
    CHECK(std::filesystem::exists(dir / "process_0.pt"));
    CHECK(!std::filesystem::exists(accel::checkpoint::partial_dir(dir)));
    const auto resumed = train_toy(99, 4, 0, "", dir.string());  // another seed: everything must come from the checkpoint
    REQUIRE(resumed.size() == straight.size());
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(at::equal(resumed[i], straight[i]));
  }
  // A job that prepared other objects is told what differs.
  {
    Solo acc;
    Net net;
    (void)acc.prepare(net);
    CHECK_THROWS_WITH(acc.load_state(dir), Catch::Contains("holds 1 optimizers, this job prepared 0") &&
                                               Catch::Contains("prepare the same objects, in the same order"));
    CHECK_THROWS_WITH(acc.load_state(dir / "nowhere"), Catch::Contains("is not a checkpoint directory"));
  }
  std::filesystem::remove_all(dir);
}
