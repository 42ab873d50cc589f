// Files written by one process for the job (tracking/trackers.hpp, checkpoint/safetensors.hpp): the trackers and
// save_model act on the main process alone. Every rank logs and saves; afterwards every rank finds exactly rank 0's
// files, complete: no line, row, record or file of another rank.
#include "../support/files.hpp"
#include "harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/tracking/tensorboard.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace mp {

namespace {
struct Job : accel::Accelerator<accel::dist::from_env> {};

using test_files::lines_of;
}  // namespace

void files(const Args& a) {
  namespace fs = std::filesystem;
  namespace tr = accel::tracking;
  const fs::path root = arg(a, 0, "mp_files");
  Job acc{accel::Options{.comm = options(30000).comm,
                         .log_with = {tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard},
                         .logging_dir = root / "logs"}};
  tally.rank = acc.process_index();
  if (acc.is_main_process()) fs::remove_all(root);
  acc.wait_for_everyone();

  // ---- trackers: every rank logs its own rank; only rank 0's steps may appear ---------------------------------
  const int steps = 12;
  acc.init_trackers("run", {{"world_size", std::int64_t(acc.num_processes())}});
  for (int s = 0; s < steps; ++s) acc.log({{"loss", 1.0 / (s + 1)}, {"rank", std::int64_t(tally.rank)}}, s);
  acc.end_training();  // closes rank 0's files, then waits for every rank
  const fs::path run = root / "logs" / "run";
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(run)) names.insert(e.path().filename().string());
  check(names.size() == 4 && names.count("metrics.jsonl") && names.count("metrics.csv") && names.count("config.json"),
        "the run holds config.json, metrics.jsonl, metrics.csv and one event file, no more");
  const auto jsonl = lines_of(run / "metrics.jsonl");
  check(int(jsonl.size()) == steps, "metrics.jsonl has one line per step: " + std::to_string(jsonl.size()));
  bool only_rank0 = true, in_order = true;
  for (std::size_t i = 0; i < jsonl.size(); ++i) {
    const auto j = nlohmann::json::parse(jsonl[i]);
    only_rank0 = only_rank0 && j["rank"] == 0;
    in_order = in_order && j["step"] == int(i) && j["loss"] == 1.0 / double(i + 1);
  }
  check(only_rank0, "every JSONL line is rank 0's");
  check(in_order, "the JSONL lines are the steps in order with their values");
  const auto csv = lines_of(run / "metrics.csv");
  check(int(csv.size()) == steps + 1 && csv[0] == "step,loss,rank", "metrics.csv: a header and one row per step");
  bool csv_rank0 = true;
  for (std::size_t i = 1; i < csv.size(); ++i) csv_rank0 = csv_rank0 && csv[i].ends_with(",0");
  check(csv_rank0, "every CSV row is rank 0's");
  for (const auto& n : names)
    if (n.starts_with("events.out.tfevents."))
      check(accel::tracking::read_records(run / n).size() == std::size_t(steps + 3),
            "the event file holds the file version, the session start, the configuration and every step, each "
            "record's CRCs intact");

  // ---- save_model: rank 0 writes the unwrapped model; every rank reads it back equal to its own -------------
  at::manual_seed(11 + tally.rank);  // different weights per rank: prepare broadcasts rank 0's
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::BatchNorm1d(10), torch::nn::Linear(10, 3));
  };
  auto net = make();
  auto model = acc.prepare(net);
  acc.save_model(model, root / "model", {.max_shard_size = 128});
  const auto index = nlohmann::json::parse(std::ifstream(root / "model" / accel::checkpoint::safe_weights_index_name));
  check(index["weight_map"].size() == 9, "the index maps every parameter and buffer");
  auto copy = make();
  accel::checkpoint::load_model(*copy, root / "model");
  bool equal = true;
  for (const auto& [name, t] : accel::checkpoint::model_state(*net)) {
    const auto params = copy->named_parameters();
    equal = equal && same(t, params.contains(name) ? params[name] : copy->named_buffers()[name]);
  }
  check(equal, "the saved model, read back, is this rank's (rank 0's broadcast) model");
  // A failure on the main process is raised on every process (not a hang at the barrier).
  if (acc.is_main_process()) std::ofstream(root / "a_file") << "x";
  std::string error;
  try {
    acc.save_model(model, root / "a_file");
  } catch (const accel::Error& e) {
    error = e.what();
  }
  check(error.find("a_file: is a file") != std::string::npos,
        "every rank raises the main process's save_model error: " + error);
  acc.wait_for_everyone();
}

}  // namespace mp
