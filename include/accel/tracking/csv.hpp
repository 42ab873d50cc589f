#pragma once
//! \file
//! `CsvWriter`: `metrics.csv`, a header `step,<name>,...` and one row per `log` call. The columns are the first
//! call's names (sorted); a later call that brings a new name widens the table: the new column is appended to the
//! header and the file is rewritten whole (through a temporary file renamed over it, so it is never half
//! written), earlier rows getting an empty cell in it. A name a call leaves out is an empty cell too. Fields with
//! a comma, a quote or a line break are quoted (RFC 4180), and an empty string is `""` (so that it differs from a
//! name the row left out); numbers are written in their shortest exact form.
//! Continuing a run (a resumed job) reads the existing file back and appends to it; from the checkpoint's
//! `Position`, only the first `calls` rows are kept (the last of them must have the checkpoint's last step), and the
//! columns that only the rows dropped brought (the header's last ones) go with them, the file rewritten whole.
//! Between widenings the writer holds the file open for appending and no rows in memory (a widening reads them back
//! from the file).

#include <accel/core/files.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace accel::tracking {

//! The CSV tracker (`Tracker::csv`): `metrics.csv`, a "step" column and one column per logged name.
class CsvWriter final : public Writer {
 public:
  static constexpr const char* file_name = "metrics.csv";  //!< the file it writes

  //! Opens the run's file as `start` says: anew, continued as it is (the rows already in it kept), or continued
  //! from a position.
  explicit CsvWriter(const std::filesystem::path& run_dir, const Start& start = {}) : path_(run_dir / file_name) {
    std::vector<std::vector<std::string>> rows;
    if (start.continuing && std::filesystem::exists(path_)) {
      rows = read_back(/*header=*/true);
      if (start.from) keep_until(rows, *start.from);
    }
    rewrite(rows);
  }
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
    if (widened) {  // the rows so far, from the file, under the wider header
      out_.close();
      auto rows = read_back(/*header=*/false);
      rows.push_back(std::move(row));
      return rewrite(rows);
    }
    out_ << line(row);
    out_.flush();
    if (!out_) throw Error("accel: tracking: could not append to " + path_.string());
  }
  void finish() override {}

 private:
  static std::string quoted(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  static std::string cell(const Value& v) {
    if (const auto* s = std::get_if<std::string>(&v)) return s->empty() ? "\"\"" : quoted(*s);
    return text(v);
  }
  std::string line(const std::vector<std::string>& row) const {
    std::string s;
    for (std::size_t i = 0; i <= columns_.size(); ++i) s += (i ? "," : "") + (i < row.size() ? row[i] : std::string());
    return s + "\n";
  }
  // The existing file's rows (fields kept as written) and, with `header`, its columns (names unquoted).
  std::vector<std::vector<std::string>> read_back(bool header) {
    const auto bytes = read_file(path_, std::filesystem::file_size(path_));
    const std::string all(bytes.begin(), bytes.end());
    std::vector<std::vector<std::string>> records(1);
    std::string field;
    bool in_quotes = false;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const char c = all[i];
      if (in_quotes) {
        field += c;
        if (c == '"' && i + 1 < all.size() && all[i + 1] == '"')
          field += all[++i];  // an escaped quote
        else if (c == '"')
          in_quotes = false;
      } else if (c == '"') {
        field += c;
        in_quotes = true;
      } else if (c == ',' || c == '\n') {
        records.back().push_back(std::exchange(field, {}));
        if (c == '\n') records.emplace_back();
      } else {
        field += c;
      }
    }
    if (!field.empty()) records.back().push_back(field);
    if (records.back().empty()) records.pop_back();
    if (records.empty() || records.front().empty() || records.front().front() != "step")
      throw Error("accel: tracking: " + path_.string() +
                  " is not a metrics table of accel (its header does not start with "
                  "\"step\"); move it away, or log into another project");
    for (std::size_t c = 1; header && c < records.front().size(); ++c) {
      std::string name = records.front()[c];
      if (name.size() >= 2 && name.front() == '"') {  // "a ""b""" -> a "b"
        std::string plain;
        for (std::size_t k = 1; k + 1 < name.size(); ++k) plain += name[k] == '"' ? name[++k] : name[k];
        name = plain;
      }
      column_.emplace(name, columns_.size());
      columns_.push_back(name);
    }
    return {records.begin() + 1, records.end()};
  }
  // Keeps the rows logged before the checkpoint (the first `at.calls`) and the columns they use: a column that only
  // later rows brought is one of the header's last, empty in every row kept.
  void keep_until(std::vector<std::vector<std::string>>& rows, const Position& at) {
    if (at.calls > 0 &&
        std::int64_t(rows.size()) >= at.calls) {  // the checkpoint's last row: the file must be that run's
      const auto& last = rows[std::size_t(at.calls - 1)];
      const std::string want = at.last_step ? std::to_string(*at.last_step) : std::string("none");
      if (last.empty() || last.front() != want)
        throw FileError(path_.string(), "row " + std::to_string(at.calls) +
                                            ", the last row logged before the checkpoint, has step " +
                                            (last.empty() ? std::string("(empty)") : last.front()) +
                                            ", the checkpoint's last step is " + want +
                                            ": the file is not that run's; move it away, or log into another project");
    }
    if (std::int64_t(rows.size()) > at.calls) rows.resize(std::size_t(at.calls));
    auto used = [&](std::size_t c) {  // column c holds a value in some row kept
      for (const auto& r : rows)
        if (c + 1 < r.size() && !r[c + 1].empty()) return true;
      return false;
    };
    while (!columns_.empty() && !used(columns_.size() - 1)) {
      column_.erase(columns_.back());
      columns_.pop_back();
    }
  }
  // The whole file (header and `rows`), through a temporary renamed over it; then open for appending.
  void rewrite(const std::vector<std::vector<std::string>>& rows) {
    std::vector<std::string> header{"step"};
    for (const auto& c : columns_) header.push_back(quoted(c));
    std::string all = line(header);
    for (const auto& r : rows) all += line(r);
    write_file_atomically(path_, all);
    out_.open(path_, std::ios::app);
    if (!out_) throw Error("accel: tracking: could not open " + path_.string() + " for appending");
  }

  std::filesystem::path path_;
  std::vector<std::string> columns_;           // the value columns, in the order they appeared
  std::map<std::string, std::size_t> column_;  // name -> index in columns_
  std::ofstream out_;                          // the file, open for appending
};

}  // namespace accel::tracking
