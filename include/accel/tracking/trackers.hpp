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
//! unless the job resumed from a checkpoint (`load_state` before `init_trackers`): then they are continued from
//! the trackers' `Position` that the checkpoint recorded (the `log` calls so far and the last step). The JSONL and
//! CSV files keep the rows logged before the checkpoint and drop those the stopped job logged after it (each file
//! rewritten atomically); TensorBoard gets a new event file (as TensorBoard's writers make: it reads every event
//! file of the folder) that starts by purging the steps past the checkpoint's last. So the resumed run's files end
//! as an uninterrupted run's. A checkpoint that recorded no position (written by an earlier accel) leaves the
//! files as they are: the JSONL and CSV files are appended to. A step left out is the number of `log` calls before
//! this one, counted from the run's start (a resumed job's from the checkpoint's position). Every process keeps
//! the position (a `Trackers` without writers, where it is not the main process), so that each takes the same
//! steps and records the same position in a checkpoint.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::tracking {

//! The trackers of one run (what `Accelerator::init_trackers`, `log` and `end_training` act on): the main process
//! writes, every process keeps the position (see the file's comment).
class Trackers {
 public:
  static constexpr const char* config_file = "config.json";  //!< the run's configuration

  Trackers() = default;
  //! Creates `dir` and one writer per kind in `kinds` (each kind once), opening their files as `start` says, then
  //! stores `config`. No kinds: nothing is written, the position is kept.
  ACCEL_DECL Trackers(const std::vector<Tracker>& kinds, const std::filesystem::path& dir, const Values& config,
                      const Start& start);
  //! `continuing`: a resumed job, whose files are continued as they are (no position known).
  Trackers(const std::vector<Tracker>& kinds, const std::filesystem::path& dir, const Values& config,
           bool continuing = false)
      : Trackers(kinds, dir, config, Start{.continuing = continuing}) {}
  //! A run without writers at `position` (none: not known), what a resumed job holds until `init_trackers`.
  static Trackers at(const std::optional<Position>& position) {
    Trackers t;
    t.position_ = position.value_or(Position{});
    t.known_ = position.has_value();
    return t;
  }
  //! Movable.
  Trackers(Trackers&&) = default;
  //! Movable.
  Trackers& operator=(Trackers&&) = default;
  ~Trackers() { finish(); }

  //! Logs `values` at `step` (none: the number of `log` calls so far) into every tracker; counts the call on every
  //! process.
  void log(const Values& values, std::optional<std::int64_t> step) {
    check_names(values, "log");
    const std::int64_t s = step.value_or(position_.calls);
    for (auto& w : writers_) w->log(values, s);
    ++position_.calls;
    position_.last_step = s;
  }
  //! How far the run has got: none when it continues files whose rows before it were not counted (a job resumed
  //! from a checkpoint that recorded no position).
  [[nodiscard]] std::optional<Position> position() const {
    return known_ ? std::optional<Position>(position_) : std::nullopt;
  }
  //! Closes every tracker's file (`end_training`).
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
  Position position_;
  bool known_ = true;  // position_ counts every row of the run's files
};

}  // namespace accel::tracking

#if ACCEL_DEFINITIONS
#include <accel/tracking/impl/trackers.ipp>
#endif
