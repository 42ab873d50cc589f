#pragma once
//! \file
//! What the experiment trackers share: the kinds (`Tracker`, Accelerate's `log_with`), the values a training
//! loop logs, and `Writer`, the interface each kind implements (Accelerate's `GeneralTracker`).
//!
//! A value is a `double`, an integer or a string: `{{"loss", 0.25}, {"epoch", 3}, {"phase", "warmup"}}`.
//! Numbers are scalars in every tracker; strings are text (a TensorBoard text summary, a JSON string, a CSV cell).

#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <variant>

//! Experiment trackers: JSONL, CSV and TensorBoard event files.
namespace accel::tracking {

//! The trackers `Options::log_with` can name; each writes into `<logging_dir>/<project_name>/`.
enum class Tracker {
  jsonl,        //!< metrics.jsonl: one JSON object per `log` call, {"step": s, name: value, ...}
  csv,          //!< metrics.csv: a "step" column, then one column per name
  tensorboard,  //!< `events.out.tfevents.<time>.<host>`: TensorBoard's event file (scalars, text)
};

//! A logged value (an `int` literal is an integer, a `double` a double, a string literal a string).
using Value = std::variant<double, std::int64_t, std::string>;
//! One `log` call's values (or a run's configuration), by name.
using Values = std::map<std::string, Value>;

//! A number as a double (an integer converted).
[[nodiscard]] inline double as_double(const Value& v) {
  return std::holds_alternative<double>(v) ? std::get<double>(v) : double(std::get<std::int64_t>(v));
}
//! A value as text: a string as it is, a number in its shortest form that reads back exactly.
[[nodiscard]] inline std::string text(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, std::get<double>(v)).ptr);
}

//! How far a run's trackers have got: the number of `log` calls so far and the step of the last one. A checkpoint
//! records it (checkpoint/format.hpp), so that a resumed job's `init_trackers` goes on from there rather than from
//! wherever the job that stopped had got to.
struct Position {
  std::int64_t calls = 0;                 //!< `log` calls so far
  std::optional<std::int64_t> last_step;  //!< the step of the last one (none before the first)

  //! The first step a continuation may log again: the step after the last one (0 before the first call).
  [[nodiscard]] std::int64_t next_step() const noexcept {
    if (!last_step) return 0;
    return *last_step == std::numeric_limits<std::int64_t>::max() ? *last_step : *last_step + 1;
  }
  //! The same position.
  bool operator==(const Position&) const = default;
};

//! How a run's files are opened (`init_trackers`).
struct Start {
  //! A resumed job (`load_state` before `init_trackers`): the run's files are continued, not started anew.
  bool continuing = false;
  //! Continuing from this position (the one the checkpoint recorded): what the files hold past it, which the job
  //! that stopped logged after its checkpoint, is dropped. None: the files are continued as they are (a
  //! checkpoint that recorded no position).
  std::optional<Position> from;
};

//! One tracker of a run (Accelerate's `GeneralTracker`): it writes only on the main process, which alone
//! creates it.
class Writer {
 public:
  virtual ~Writer() = default;
  //! The run's hyperparameters (`init_trackers`' config), once, before any `log`.
  virtual void store_config(const Values& config) = 0;
  //! One step's values; written through (flushed) before it returns, so that a crash loses no logged step.
  virtual void log(const Values& values, std::int64_t step) = 0;
  //! Closes the files (`end_training`); nothing is written after it.
  virtual void finish() = 0;
};

}  // namespace accel::tracking
