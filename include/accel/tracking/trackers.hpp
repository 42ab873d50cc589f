#pragma once
//! \file
//! `Trackers`: the trackers of one run, what `Accelerator::init_trackers`, `log` and `end_training` act on.
//!
//! \code
//! Acc acc{accel::Options{.log_with = {accel::tracking::Tracker::jsonl, accel::tracking::Tracker::tensorboard},
//!                        .logging_dir = "logs"}};
//! acc.init_trackers("mnist", {{"lr", 1e-3}, {"batch_size", 64}, {"optimizer", "adamw"}});
//! acc.log({{"loss", loss.item<double>()}, {"lr", sched.get_last_lr()}}, step);
//! acc.end_training();
//! \endcode
//!
//! Everything is written by the main process alone, into `<logging_dir>/<project_name>/`: the configuration in
//! `config.json` (every tracker; TensorBoard also gets it as a text summary), then each tracker's file
//! (tracking/jsonl.hpp, tracking/csv.hpp, tracking/tensorboard.hpp). `init_trackers` starts a run's files anew,
//! unless the job resumed from a checkpoint (`load_state` before `init_trackers`): then the JSONL and CSV files
//! are appended to. The event file is a new one either way, as TensorBoard's writers make (TensorBoard reads
//! every event file of the folder). A step left out is the number of `log` calls
//! before this one.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#if ACCEL_DEFINITIONS  // the writers; under ACCEL_SEPARATE_COMPILATION only <accel/src.hpp> compiles them
#include <accel/core/files.hpp>
#include <accel/tracking/csv.hpp>
#include <accel/tracking/jsonl.hpp>
#include <accel/tracking/tensorboard.hpp>
#endif

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::tracking {

class Trackers {
 public:
  static constexpr const char* config_file = "config.json";

  ACCEL_DECL Trackers() = default;
  //! Creates `dir` and one writer per kind in `kinds` (each kind once), then stores `config`. `continuing`: a
  //! resumed job, whose files are appended to.
  Trackers(const std::vector<Tracker>& kinds, const std::filesystem::path& dir, const Values& config,
           bool continuing = false);
  Trackers(Trackers&&) = default;
  Trackers& operator=(Trackers&&) = default;
  ~Trackers() { finish(); }

  void log(const Values& values, std::optional<std::int64_t> step) {
    check_names(values, "log");
    const std::int64_t s = step.value_or(calls_);
    ++calls_;
    for (auto& w : writers_) w->log(values, s);
  }
  void finish() {
    for (auto& w : writers_) w->finish();
    writers_.clear();
  }

  //! A name is non-empty and not "step" (the JSONL and CSV files' step column).
  static void check_names(const Values& values, const char* call) {
    for (const auto& [k, v] : values)
      if (k.empty() || k == "step")  // no message built for a good name: this runs on every log call
        throw InvalidArgument(std::string("accel::Accelerator::") + call + ": a value named '" + k +
                              "': names must be non-empty and not \"step\" (the step is log's second argument)");
  }

 private:
  std::vector<std::unique_ptr<Writer>> writers_;
  std::int64_t calls_ = 0;
};

#if ACCEL_DEFINITIONS
ACCEL_DECL Trackers::Trackers(const std::vector<Tracker>& kinds, const std::filesystem::path& dir, const Values& config,
                              bool continuing) {
  check_names(config, "init_trackers");
  for (std::size_t i = 0; i < kinds.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (kinds[i] == kinds[j]) throw InvalidArgument("accel: Options::log_with names a tracker twice");
  if (kinds.empty()) return;
  std::filesystem::create_directories(dir);
  for (const auto k : kinds) {
    if (k == Tracker::jsonl) writers_.push_back(std::make_unique<JsonlWriter>(dir, continuing));
    else if (k == Tracker::csv) writers_.push_back(std::make_unique<CsvWriter>(dir, continuing));
    else writers_.push_back(std::make_unique<TensorBoardWriter>(dir));
  }
  write_file_atomically(dir / config_file, detail::json_object(config, std::nullopt, /*pretty=*/true) + "\n");
  for (auto& w : writers_) w->store_config(config);
}
#endif

}  // namespace accel::tracking
