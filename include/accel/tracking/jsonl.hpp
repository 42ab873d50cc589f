#pragma once
//! \file
//! `JsonlWriter`: `metrics.jsonl`, one JSON object per `log` call, `{"step": 3, "loss": 0.25, ...}` (the step
//! first, then the values by name). Non-finite numbers are
//! written as `null` (JSON has no NaN). `init_trackers` starts the file anew.

#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <variant>

namespace accel::tracking {

namespace detail {
inline nlohmann::ordered_json to_json(const Value& v) {
  return std::visit([](const auto& x) { return nlohmann::ordered_json(x); }, v);
}
}  // namespace detail

class JsonlWriter final : public Writer {
 public:
  static constexpr const char* file_name = "metrics.jsonl";

  //! `continuing`: a resumed job's writer, which appends to the file.
  explicit JsonlWriter(const std::filesystem::path& run_dir, bool continuing = false)
      : path_(run_dir / file_name), out_(path_, continuing ? std::ios::app : std::ios::trunc) {
    if (!out_) throw Error("accel: tracking: could not create " + path_.string());
  }
  //! The configuration is not a step: `Trackers` writes it to config.json.
  void store_config(const Values&) override {}
  void log(const Values& values, std::int64_t step) override {
    nlohmann::ordered_json j{{"step", step}};
    for (const auto& [k, v] : values) j[k] = detail::to_json(v);
    out_ << j.dump() << '\n' << std::flush;
    if (!out_) throw Error("accel: tracking: could not write " + path_.string());
  }
  void finish() override { out_.close(); }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace accel::tracking
