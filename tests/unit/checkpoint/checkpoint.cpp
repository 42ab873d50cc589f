// Checkpoints (checkpoint/checkpointer.hpp, checkpoint/format.hpp) through the Accelerator: a fresh job that loads a
// mid-epoch checkpoint ends bit-identical to one that never stopped; a checkpoint of other objects is refused.
#include "../support.hpp"
#include "../training_support.hpp"

#include "../../support/streams.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ranges>
#include <sstream>
#include <tuple>

using namespace accel_test;

namespace {
// Trains Net for `epochs` epochs on `data` (a loader of `options`) with Adam, StepLR and 2-step accumulation.
// `stop_after` > 0: stop after that many batches overall and save to `save_dir`. `resume_dir`: load first.
template <class Data>
std::vector<at::Tensor> train_on(Data data, const accel::data::DataLoaderOptions& options, std::uint64_t seed,
                                 int epochs, std::int64_t stop_after, const std::string& save_dir,
                                 const std::string& resume_dir) {
  Solo acc{accel::Options{.seed = seed, .gradient_accumulation_steps = 2}};
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, opt, loader, sched] = acc.prepare(net, adam, accel::data::DataLoader(std::move(data), options),
                                                 std::make_shared<torch::optim::StepLR>(*adam, 3, 0.5));
  if (!resume_dir.empty()) acc.load_state(resume_dir);
  std::int64_t seen = 0;
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    for (const auto& batch : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model(batch.data), batch.target));
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

// The toy data (70 samples), shuffled, batch 8.
std::vector<at::Tensor> train_toy(std::uint64_t seed, int epochs, std::int64_t stop_after, const std::string& save_dir,
                                  const std::string& resume_dir) {
  return train_on(toy_data(70), {.batch_size = 8, .shuffle = true}, seed, epochs, stop_after, save_dir, resume_dir);
}

// The same samples as a stream of unknown length (made one by one, no size()), batch 8, 2 workers.
std::vector<at::Tensor> train_stream(std::uint64_t seed, int epochs, std::int64_t stop_after,
                                     const std::string& save_dir, const std::string& resume_dir) {
  const auto toy = toy_data(70);
  auto stream = Generated{70} | std::views::transform([toy](std::int64_t i) { return toy.get(i); });
  static_assert(accel::data::IterableDataset<decltype(stream)> && !std::ranges::sized_range<decltype(stream)>);
  return train_on(std::move(stream), {.batch_size = 8, .workers = 2}, seed, epochs, stop_after, save_dir, resume_dir);
}
}  // namespace

TEST_CASE("resume: a fresh job that loads a mid-epoch checkpoint ends bit-identical to one that never stopped",
          "[accelerator][checkpoint]") {
  accel::ProcessState::reset();
  const auto dir = std::filesystem::temp_directory_path() / ("accel_resume_" + std::to_string(::getpid()));
  const auto straight = train_toy(11, 4, 0, "", "");
  for (std::int64_t cut : {5, 9, 13, 27}) {  // inside the 1st, 2nd, 2nd (epoch end) and 4th epochs; odd and even steps
    INFO("checkpoint after batch " << cut);
    train_toy(11, 4, cut, dir.string(), "");
    CHECK(std::filesystem::exists(dir / "process_0.pt"));
    CHECK(!std::filesystem::exists(accel::checkpoint::partial_dir(dir)));
    const auto resumed =
        train_toy(99, 4, 0, "", dir.string());  // another seed: everything must come from the checkpoint
    check_equal(resumed, straight);
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

TEST_CASE("resume: a job over a stream of unknown length ends bit-identical to one that never stopped",
          "[accelerator][checkpoint][stream]") {
  accel::ProcessState::reset();
  const auto dir = std::filesystem::temp_directory_path() / ("accel_resume_stream_" + std::to_string(::getpid()));
  const auto straight = train_stream(11, 3, 0, "", "");
  for (std::int64_t cut : {3, 9, 10, 20}) {  // inside the 1st and 2nd epochs, at the 2nd's end, in the 3rd
    INFO("checkpoint after batch " << cut);
    train_stream(11, 3, cut, dir.string(), "");
    check_equal(train_stream(99, 3, 0, "", dir.string()), straight);
  }
  std::filesystem::remove_all(dir);
}

namespace {
// The checkpoint file `file` rewritten with `key` set to `value`, and its directory's manifest rewritten to match:
// a file from elsewhere, not damage.
void forge(const std::filesystem::path& file, const std::string& key, const c10::IValue& value) {
  torch::serialize::InputArchive in;
  in.load_from(file.string());
  with_value(in, key, value).save_to(file.string());
  accel::checkpoint::Manifest::of_directory(file.parent_path()).write(file.parent_path());
}

// Loads `dir` into a job like train_toy's, under `o`.
void load_like_toy(const std::filesystem::path& dir, accel::Options o, accel::LoadOptions l = {}) {
  Solo acc{o};
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  (void)acc.prepare(net, adam, accel::data::DataLoader(toy_data(70), {.batch_size = 8, .shuffle = true}),
                    std::make_shared<torch::optim::StepLR>(*adam, 3, 0.5));
  acc.load_state(dir, l);
}
}  // namespace

TEST_CASE("resume: a checkpoint of other training settings is refused naming both values, unless allowed",
          "[accelerator][checkpoint]") {
  namespace fs = std::filesystem;
  accel::ProcessState::reset();
  const auto dir = fs::temp_directory_path() / ("accel_settings_" + std::to_string(::getpid()));
  train_toy(11, 4, 5, dir.string(), "");  // gradient_accumulation_steps 2, mixed precision off
  const auto meta = (dir / accel::checkpoint::meta_file).string();
  SECTION("the same settings load") { CHECK_NOTHROW(load_like_toy(dir, {.gradient_accumulation_steps = 2})); }
  SECTION("another gradient_accumulation_steps") {
    CHECK_THROWS_WITH(load_like_toy(dir, {.gradient_accumulation_steps = 4}),
                      Catch::Contains(meta + " was saved with gradient_accumulation_steps = 2, this job has 4") &&
                          Catch::Contains("accel::LoadOptions{.allow_changed_settings = true}"));
    CHECK_NOTHROW(load_like_toy(dir, {.gradient_accumulation_steps = 4}, {.allow_changed_settings = true}));
  }
  SECTION("another mixed precision (bf16 against off)") {
    CHECK_THROWS_WITH(load_like_toy(dir, {.gradient_accumulation_steps = 2, .mixed_precision = accel::Precision::bf16}),
                      Catch::Contains(meta + " was saved with mixed_precision = no, this job has bf16") &&
                          Catch::Contains("Use the same Options::mixed_precision"));
    CHECK_NOTHROW(load_like_toy(dir, {.gradient_accumulation_steps = 2, .mixed_precision = accel::Precision::bf16},
                                {.allow_changed_settings = true}));
  }
  SECTION("the format, a model's shapes, the GradScaler: each refused naming the file") {
    namespace ck = accel::checkpoint;
    const ck::Checkpointer::Process one{0, 1, c10::Device(c10::kCPU), [] {}};
    const auto other = dir.string() + "_other";
    auto saved = [&](std::int64_t out_features, bool scaler) {
      ck::Checkpointer c;
      c.add_model(torch::nn::Linear(4, out_features).ptr());
      if (scaler) c.set_scaler({[](auto& a) { a.write("scale", c10::IValue(2.0)); }, [](auto&) {}});
      return c;
    };
    saved(3, false).save(other, one, 0, false);
    try {
      saved(5, false).load(other, one);
      FAIL("loaded a model of another shape");
    } catch (const accel::FileError& e) {
      CHECK(e.path() == other + "/model.pt");
      CHECK_THAT(e.what(),
                 Catch::Contains("holds weight of shape [3, 4] and dtype Float, the model's is [5, 4] Float"));
    }
    CHECK_THROWS_WITH(saved(3, true).load(other, one),
                      Catch::Contains("disagree on mixed precision (GradScaler present in one only)"));
    // A format this accel does not read.
    forge(fs::path(other) / ck::meta_file, "format_version", std::int64_t(99));
    CHECK_THROWS_WITH(saved(3, false).load(other, one),
                      Catch::Contains("checkpoint format 99, this accel reads formats 2 to 3"));
    fs::remove_all(other);
    // A sharded (ZeRO) optimizer's state, loaded into an unsharded job's optimizer.
    torch::nn::Linear lin(4, 3);
    auto sgd = std::make_shared<torch::optim::SGD>(lin->parameters(), 0.1);
    torch::serialize::OutputArchive zero;
    sgd->save(zero);
    zero.write("zero_sharded", c10::IValue(std::int64_t(1)));
    std::ostringstream bytes;
    zero.save_to(bytes);
    torch::serialize::InputArchive back;
    const std::string b = bytes.str();
    back.load_from(b.data(), b.size());
    accel::AcceleratedOptimizer<torch::optim::SGD> unsharded(sgd);
    CHECK_THROWS_WITH(unsharded.load(back), Catch::Contains("the checkpoint's optimizer was sharded") &&
                                                Catch::Contains("and this job's is not"));
  }
  SECTION("settings out of range, under a consistent manifest: an error naming the file and the field") {
    for (const auto& [key, value, field] : std::vector<std::tuple<std::string, std::int64_t, std::string>>{
             {"mixed_precision", 7, "'mixed_precision' is 7"},
             {"gradient_accumulation_steps", 0, "'gradient_accumulation_steps' is 0"},
             {"gradient_accumulation_steps", std::int64_t(1) << 40,
              "'gradient_accumulation_steps' is 1099511627776"}}) {
      INFO(key << " = " << value);
      forge(meta, key, value);
      try {
        load_like_toy(dir, {.gradient_accumulation_steps = 2}, {.allow_changed_settings = true});
        FAIL("loaded");
      } catch (const accel::FileError& e) {
        CHECK(e.path() == meta);
        CHECK_THAT(e.what(), Catch::Contains("damaged training settings: " + field));
      }
      train_toy(11, 4, 5, dir.string(), "");  // whole again
    }
  }
  fs::remove_all(dir);
}

namespace {
// Copies `from` to a fresh `to`.
void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to);
}
void overwrite(const std::filesystem::path& file, std::uintmax_t keep,
               std::optional<std::uintmax_t> flip = std::nullopt) {
  std::filesystem::resize_file(file, keep);
  if (flip) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(*flip));
    const char c = char(f.get() ^ 0x10);
    f.seekp(std::streamoff(*flip));
    f.put(c);
  }
}
// Loads `dir` into a job like train_toy's; returns the accel::FileError it throws (or fails the test).
accel::FileError load_error(const std::filesystem::path& dir) {
  Solo acc;
  Net net;
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  (void)acc.prepare(net, adam, accel::data::DataLoader(toy_data(70), {.batch_size = 8, .shuffle = true}),
                    std::make_shared<torch::optim::StepLR>(*adam, 3, 0.5));
  try {
    acc.load_state(dir);
  } catch (const accel::FileError& e) {
    return e;
  }
  FAIL("load_state(" << dir << ") did not throw accel::FileError");
  throw std::logic_error("not reached");
}
}  // namespace

TEST_CASE("manifest: a damaged, truncated or incomplete checkpoint is one error naming the file",
          "[accelerator][checkpoint]") {
  namespace fs = std::filesystem;
  accel::ProcessState::reset();
  const auto base = fs::temp_directory_path() / ("accel_manifest_" + std::to_string(::getpid()));
  const auto good = base / "good", bad = base / "bad";
  train_toy(11, 4, 5, good.string(), "");
  REQUIRE(fs::exists(good / accel::checkpoint::manifest_file));
  const auto manifest = accel::checkpoint::Manifest::read(good);
  // Every file of the checkpoint is listed, with its size, and nothing else.
  std::vector<std::string> listed, present;
  for (const auto& e : manifest.files) {
    listed.push_back(e.name);
    CHECK(fs::file_size(good / e.name) == e.size);
  }
  for (const auto& f : fs::directory_iterator(good))
    if (f.path().filename() != accel::checkpoint::manifest_file) present.push_back(f.path().filename().string());
  std::sort(present.begin(), present.end());
  CHECK(listed == present);
  const auto model_size = fs::file_size(good / "model.pt");

  SECTION("a truncated model.pt: size mismatch, before LibTorch reads it") {
    copy_checkpoint(good, bad);
    overwrite(bad / "model.pt", model_size / 2);
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / "model.pt").string());
    CHECK_THAT(e.what(), Catch::Contains("size mismatch: " + std::to_string(model_size / 2) +
                                         " bytes, the manifest lists " + std::to_string(model_size)));
  }
  SECTION("a flipped bit in the process record: checksum mismatch") {
    copy_checkpoint(good, bad);
    overwrite(bad / "process_0.pt", fs::file_size(good / "process_0.pt"), 100);
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / "process_0.pt").string());
    CHECK_THAT(e.what(), Catch::Contains("checksum mismatch: CRC-32C"));
  }
  SECTION("no manifest (a save that did not finish): never loaded as complete") {
    copy_checkpoint(good, bad);
    fs::remove(bad / accel::checkpoint::manifest_file);
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / accel::checkpoint::manifest_file).string());
    CHECK_THAT(e.what(), Catch::Contains("the checkpoint is incomplete"));
  }
  SECTION("a truncated manifest") {
    copy_checkpoint(good, bad);
    overwrite(bad / accel::checkpoint::manifest_file, fs::file_size(good / accel::checkpoint::manifest_file) - 12);
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / accel::checkpoint::manifest_file).string());
    CHECK_THAT(e.what(), Catch::Contains("damaged checkpoint manifest"));
  }
  SECTION("a listed file missing") {
    copy_checkpoint(good, bad);
    fs::remove(bad / "scheduler.pt");
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / "scheduler.pt").string());
    CHECK_THAT(e.what(), Catch::Contains("missing: the manifest lists it with"));
  }
  SECTION("a truncated model.pt that the manifest agrees with: LibTorch's error, named, without its backtrace") {
    copy_checkpoint(good, bad);
    overwrite(bad / "model.pt", model_size - 30);
    accel::checkpoint::Manifest::of_directory(bad).write(bad);
    const auto e = load_error(bad);
    CHECK(e.path() == (bad / "model.pt").string());
    CHECK_THAT(e.what(), Catch::StartsWith((bad / "model.pt").string() + ": not a readable LibTorch archive"));
    CHECK_THAT(e.what(), !Catch::Contains("Exception raised from") && !Catch::Contains("frame #"));
  }
  SECTION("a file the manifest does not list is never read, and does not stop the load") {
    copy_checkpoint(good, bad);
    std::ofstream(bad / "notes.txt") << "written by hand";
    const auto resumed = train_toy(99, 4, 0, "", bad.string());
    CHECK(!resumed.empty());
  }
  fs::remove_all(base);
}

TEST_CASE(
    "resume: a scheduler state from elsewhere with a counter out of range is refused naming the file and the field",
    "[accelerator][checkpoint]") {
  namespace fs = std::filesystem;
  namespace ck = accel::checkpoint;
  accel::ProcessState::reset();
  const auto dir = fs::temp_directory_path() / ("accel_forged_scheduler_" + std::to_string(::getpid()));
  train_toy(11, 4, 5, dir.string(), "");
  // The scheduler's file rewritten with LibTorch's step count at -1 (4294967295 once truncated to its unsigned),
  // and the manifest rewritten to match: the file is what the manifest lists, not what accel wrote.
  const auto file = (dir / ck::indexed("scheduler", 0)).string();
  forge(file, "step_count", std::int64_t(-1));
  try {
    load_like_toy(dir, {.gradient_accumulation_steps = 2});
    FAIL("loaded a scheduler step count of -1");
  } catch (const accel::FileError& e) {
    CHECK(e.path() == file);
    CHECK_THAT(e.what(), Catch::Contains("scheduler state 'step_count' is -1, outside [0, 4294967295]"));
  }
  fs::remove_all(dir);
}
