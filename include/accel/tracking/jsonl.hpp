#pragma once
//! \file
//! `JsonlWriter`: `metrics.jsonl`, one JSON object per `log` call, `{"step": 3, "loss": 0.25, ...}` (the step
//! first, then the values by name). Non-finite numbers are
//! written as `null` (JSON has no NaN). `init_trackers` starts the file anew, or for a resumed job continues it:
//! from the checkpoint's `Position`, the first `calls` rows are kept (the last of them must have the checkpoint's
//! last step) and the rest, with a line a crash cut short, is dropped (the file rewritten whole, atomically).

#include <accel/core/files.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>

namespace accel::tracking {

namespace detail {
//! `s` as a JSON string: quotes, backslashes and control characters escaped; other bytes (UTF-8) as they are.
inline void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}
//! A value as JSON: integers as they are, doubles in their shortest exact form (with ".0" when integral, `null`
//! when not finite: JSON has no NaN), strings escaped.
inline void append_json(std::string& out, const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return append_json_string(out, *s);
  if (const auto* i = std::get_if<std::int64_t>(&v)) {
    out += std::to_string(*i);
    return;
  }
  const double d = std::get<double>(v);
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  const std::string t = text(v);
  out += t;
  if (t.find_first_of(".e") == std::string::npos) out += ".0";
}
//! `{"step": s, "name": value, ...}` on one line (`step` first when given), or, `pretty`, one member a line
//! indented by two spaces. Flat objects only: that is all the trackers write, and it keeps a JSON library's
//! templates out of every translation unit that includes the Accelerator.
inline std::string json_object(const Values& values, std::optional<std::int64_t> step = std::nullopt,
                               bool pretty = false) {
  if (values.empty() && !step) return "{}";
  std::string out = "{";
  bool first = true;
  auto member = [&](const std::string& name, const Value& v) {
    out += first ? "" : ",";
    out += pretty ? "\n  " : "";
    first = false;
    append_json_string(out, name);
    out += pretty ? ": " : ":";
    append_json(out, v);
  };
  if (step) member("step", *step);
  for (const auto& [k, v] : values) member(k, v);
  out += pretty ? "\n}" : "}";
  return out;
}
}  // namespace detail

//! The JSONL tracker (`Tracker::jsonl`): `metrics.jsonl`, one JSON object per `log` call.
class JsonlWriter final : public Writer {
 public:
  static constexpr const char* file_name = "metrics.jsonl";  //!< the file it writes

  //! Opens the run's file as `start` says: anew, continued as it is, or continued from a position.
  explicit JsonlWriter(const std::filesystem::path& run_dir, const Start& start = {}) : path_(run_dir / file_name) {
    if (start.continuing && start.from && std::filesystem::exists(path_)) keep_until(*start.from);
    out_.open(path_, start.continuing ? std::ios::app : std::ios::trunc);
    if (!out_) throw Error("accel: tracking: could not create " + path_.string());
  }
  //! The configuration is not a step: `Trackers` writes it to config.json.
  void store_config(const Values&) override {}
  void log(const Values& values, std::int64_t step) override {
    out_ << detail::json_object(values, step) << '\n' << std::flush;
    if (!out_) throw Error("accel: tracking: could not write " + path_.string());
  }
  void finish() override { out_.close(); }

 private:
  // Keeps the rows logged before the checkpoint: the first `at.calls` complete lines.
  void keep_until(const Position& at) {
    const auto bytes = read_file(path_, std::filesystem::file_size(path_));
    const std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    std::size_t end = 0;  // the end of the rows kept
    std::int64_t rows = 0;
    std::string_view last;
    for (std::size_t nl; rows < at.calls && (nl = all.find('\n', end)) != std::string_view::npos; ++rows) {
      last = all.substr(end, nl - end);
      end = nl + 1;
    }
    if (rows > 0 && rows == at.calls) {  // the checkpoint's last row: the file must be that run's
      const auto step = step_of(last);
      if (!step)
        throw FileError(path_.string(),
                        "line " + std::to_string(rows) +
                            " is not a row of accel's metrics (it does not start with "
                            "{\"step\": and an integer); move the file away, or log into another project");
      if (step != at.last_step)
        throw FileError(path_.string(), "line " + std::to_string(rows) +
                                            ", the last row logged before the checkpoint, has step " +
                                            std::to_string(*step) + ", the checkpoint's last step is " +
                                            (at.last_step ? std::to_string(*at.last_step) : std::string("none")) +
                                            ": the file is not that run's; move it away, or log into another project");
    }
    if (end != all.size()) write_file_atomically(path_, all.substr(0, end));
  }
  // The step of a row `{"step":s,...}`, if it is one.
  static std::optional<std::int64_t> step_of(std::string_view row) {
    constexpr std::string_view head = "{\"step\":";
    if (!row.starts_with(head)) return std::nullopt;
    std::int64_t step = 0;
    const char* const end = row.data() + row.size();
    const auto [p, ec] = std::from_chars(row.data() + head.size(), end, step);
    if (ec != std::errc() || p == end || (*p != ',' && *p != '}')) return std::nullopt;
    return step;
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace accel::tracking
