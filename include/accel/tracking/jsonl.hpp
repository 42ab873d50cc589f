#pragma once
//! \file
//! `JsonlWriter`: `metrics.jsonl`, one JSON object per `log` call, `{"step": 3, "loss": 0.25, ...}` (the step
//! first, then the values by name). Non-finite numbers are
//! written as `null` (JSON has no NaN). `init_trackers` starts the file anew.

#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <variant>

namespace accel::tracking {

namespace detail {
//! `s` as a JSON string: quotes, backslashes and control characters escaped; other bytes (UTF-8) as they are.
inline void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
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
inline std::string json_object(const Values& values, std::optional<std::int64_t> step = std::nullopt, bool pretty = false) {
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
    out_ << detail::json_object(values, step) << '\n' << std::flush;
    if (!out_) throw Error("accel: tracking: could not write " + path_.string());
  }
  void finish() override { out_.close(); }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace accel::tracking
