#pragma once
//! \file
//! `CsvWriter`: `metrics.csv`, a header `step,<name>,...` and one row per `log` call. The columns are the first
//! call's names (sorted); a later call that brings a new name widens the table: the new column is appended to the
//! header and the file is rewritten whole (through a temporary file renamed over it, so it is never half
//! written), earlier rows getting an empty cell in it. A name a call leaves out is an empty cell too. Fields with
//! a comma, a quote or a line break are quoted (RFC 4180); numbers are written in their shortest exact form.

#include <accel/core/files.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace accel::tracking {

class CsvWriter final : public Writer {
 public:
  static constexpr const char* file_name = "metrics.csv";

  explicit CsvWriter(const std::filesystem::path& run_dir) : path_(run_dir / file_name) { rewrite(); }
  //! The configuration is not a table row: `Trackers` writes it to config.json.
  void store_config(const Values&) override {}
  void log(const Values& values, std::int64_t step) override {
    bool widened = false;
    for (const auto& [k, v] : values)
      if (!column_.count(k)) {
        column_.emplace(k, columns_.size());
        columns_.push_back(k);
        widened = true;
      }
    std::vector<std::string> row(columns_.size() + 1);
    row[0] = std::to_string(step);
    for (const auto& [k, v] : values) row[column_.at(k) + 1] = cell(v);
    rows_.push_back(std::move(row));
    if (widened) return rewrite();
    std::ofstream out(path_, std::ios::app);
    out << line(rows_.back());
    out.close();
    if (!out) throw Error("accel: tracking: could not append to " + path_.string());
  }
  void finish() override {}

 private:
  static std::string quoted(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  static std::string cell(const Value& v) { return std::holds_alternative<std::string>(v) ? quoted(text(v)) : text(v); }
  std::string line(const std::vector<std::string>& row) const {
    std::string s;
    for (std::size_t i = 0; i <= columns_.size(); ++i) s += (i ? "," : "") + (i < row.size() ? row[i] : std::string());
    return s + "\n";
  }
  void rewrite() {
    std::vector<std::string> header{"step"};
    for (const auto& c : columns_) header.push_back(quoted(c));
    std::string all = line(header);
    for (const auto& r : rows_) all += line(r);
    write_file_atomically(path_, all);
  }

  std::filesystem::path path_;
  std::vector<std::string> columns_;           // the value columns, in the order they appeared
  std::map<std::string, std::size_t> column_;  // name -> index in columns_
  std::vector<std::vector<std::string>> rows_;  // every row so far, for a rewrite when a column is added
};

}  // namespace accel::tracking
