#pragma once
//! \file
//! `TensorBoardWriter`: a TensorBoard event file written without TensorFlow or protobuf, readable by TensorBoard
//! (and its `EventAccumulator`).
//!
//! The file `events.out.tfevents.<unix time>.<host name>` is a sequence of TFRecords: the length (u64, little
//! endian), the masked CRC32C of those 8 bytes (u32), the data, the masked CRC32C of the data (u32). Each record
//! is a serialized `tensorflow.Event`: `wall_time` (field 1, double), `step` (2, int64), then one of `file_version`
//! (3, "brain.Event:2", the first record), `summary` (5) or `session_log` (7). The second record marks the start of
//! a session, `SessionLog{status: START}`, at the step the run goes on from: 0 for a fresh run, the step after the
//! last one logged before the checkpoint for a resumed job (the version record carries that step too, as PyTorch's
//! `SummaryWriter(purge_step=...)` writes them). On reading it, TensorBoard discards the events at that step or
//! later that it read from the folder's earlier event files: those a stopped job logged after its checkpoint, or a
//! previous run's. (Its `plugin_event_accumulator` ignores a run's first START, hence one in every file, a fresh
//! run's too; the older `event_accumulator` purges on every START but keeps text summaries.) A job resumed from a
//! checkpoint that recorded no position writes no START: its file adds to the earlier ones. A log call is one
//! Event whose Summary holds one `Summary.Value` per name: `tag` (1) and `simple_value` (2, float) for numbers; for
//! strings a text summary, the tensor (8: `TensorProto{dtype: DT_STRING, string_val}`) with `metadata` (9:
//! `SummaryMetadata{plugin_data{plugin_name: "text"}}`), as `SummaryWriter.add_text` writes it. The run's
//! configuration is written at step 0 twice: as a text summary, tag "config" (a Markdown table), and as the
//! hparams plugin's data (`_hparams_/experiment`: each name with its type, `_hparams_/session_start_info`: the
//! values; `HParamsPluginData` of tensorboard/plugins/hparams), so that TensorBoard's HPARAMS tab lists the run.
//! A job resumed past step 0 in a folder that already has an event file does not write it again (the first
//! session's, at step 0, stays).
//! The protobuf subset is encoded by hand (varints, fixed 32/64-bit, length-delimited fields); CRC32C is
//! core/crc32c.hpp's. Every record is flushed when written.
//!
//! `read_records(path)` reads such a file back, checking the framing and both CRCs of every record.

#include <accel/core/crc32c.hpp>
#include <accel/core/files.hpp>
#include <accel/error.hpp>
#include <accel/tracking/tracker.hpp>

#include <unistd.h>  // gethostname

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace accel::tracking {

using accel::crc32c;

//! TFRecord's masked CRC: rotated right by 15 bits plus a constant, so that a CRC of CRCs is not trivially zero.
inline std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

namespace detail {

//! `v`'s low `n` bytes, little endian.
inline std::string le_bytes(std::uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char((v >> (8 * i)) & 0xFF);
  return s;
}

//! A protobuf message under construction (the wire format only: no schema).
class Proto {
 public:
  Proto& varint(int field, std::uint64_t v) { return key(field, 0), raw_varint(v), *this; }
  Proto& fixed64(int field, double v) {
    return key(field, 1), buf_ += le_bytes(std::bit_cast<std::uint64_t>(v), 8), *this;
  }
  Proto& fixed32(int field, float v) {
    return key(field, 5), buf_ += le_bytes(std::bit_cast<std::uint32_t>(v), 4), *this;
  }
  Proto& bytes(int field, std::string_view s) {
    key(field, 2);
    raw_varint(s.size());
    buf_.append(s);
    return *this;
  }
  Proto& message(int field, const Proto& m) { return bytes(field, m.buf_); }
  [[nodiscard]] const std::string& str() const noexcept { return buf_; }

 private:
  void key(int field, int wire) { raw_varint((std::uint64_t(field) << 3) | std::uint64_t(wire)); }
  void raw_varint(std::uint64_t v) {
    while (v >= 0x80) {
      buf_ += char((v & 0x7F) | 0x80);
      v >>= 7;
    }
    buf_ += char(v);
  }
  std::string buf_;
};

//! A `Summary.Value` for a plugin: a string tensor (`TensorProto{dtype: DT_STRING, string_val}`) and
//! `SummaryMetadata{plugin_data{plugin_name, content}}`.
inline Proto plugin_value(const std::string& tag, const std::string& plugin_name, const std::string& content,
                          const std::string& text = "") {
  constexpr int dt_string = 7;  // tensorflow.DataType.DT_STRING
  Proto plugin, metadata, tensor, value;
  plugin.bytes(1, plugin_name);
  if (!content.empty()) plugin.bytes(2, content);
  metadata.message(1, plugin);
  tensor.varint(1, dt_string).message(2, Proto{}).bytes(8, text);
  value.bytes(1, tag).message(8, tensor).message(9, metadata);
  return value;
}
//! A text summary (what `SummaryWriter.add_text` writes).
inline Proto text_value(const std::string& tag, const std::string& text) { return plugin_value(tag, "text", "", text); }

}  // namespace detail

//! The TensorBoard tracker (`Tracker::tensorboard`): an event file of scalars and text summaries, as PyTorch's
//! `SummaryWriter` writes.
class TensorBoardWriter final : public Writer {
 public:
  //! Creates the event file in `run_dir` and writes its first records: the file version and (unless `start` continues
  //! a run whose position was not recorded) the session's start.
  explicit TensorBoardWriter(const std::filesystem::path& run_dir, const Start& start = {}) {
    const bool purge = !start.continuing || start.from;
    const std::int64_t from = start.from ? start.from->next_step() : 0;
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
    const std::string stem = "events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + host;
    bool earlier = false;  // an event file of an earlier job is in the folder
    for (const auto& e : std::filesystem::directory_iterator(run_dir))
      earlier = earlier || e.path().filename().string().starts_with("events.out.tfevents.");
    config_kept_ = start.from && from > 0 && earlier;
    // Two runs started within one second in one directory: the second gets a suffix rather than sharing a file.
    path_ = run_dir / stem;
    for (int i = 1; std::filesystem::exists(path_); ++i) path_ = run_dir / (stem + "." + std::to_string(i));
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_) throw Error("accel: tracking: could not create " + path_.string());
    detail::Proto event;
    event.fixed64(1, now()).varint(2, std::uint64_t(from)).bytes(3, "brain.Event:2");
    write(event.str());
    if (purge) {
      constexpr int start_status = 1;  // SessionLog.SessionStatus.START
      detail::Proto session, marker;
      session.varint(1, start_status);
      marker.fixed64(1, now()).varint(2, std::uint64_t(from)).message(7, session);
      write(marker.str());
    }
  }
  void store_config(const Values& config) override {
    if (config.empty() || config_kept_) return;
    std::string table = "| name | value |\n|---|---|\n";
    for (const auto& [k, v] : config) table += "| " + k + " | " + text(v) + " |\n";
    detail::Proto summary;
    summary.message(1, detail::text_value("config", table));
    // The hparams plugin's view of the same: the experiment (each name and its type) and this session's values.
    detail::Proto experiment, session;
    for (const auto& [k, v] : config) {
      const bool is_text = std::holds_alternative<std::string>(v);
      detail::Proto info, entry, value;
      info.bytes(1, k).varint(4, is_text ? 1 : 3);  // HParamInfo{name, type: DATA_TYPE_STRING | DATA_TYPE_FLOAT64}
      experiment.message(4, info);
      if (is_text)
        value.bytes(3, std::get<std::string>(v));  // google.protobuf.Value{string_value}
      else
        value.fixed64(2, as_double(v));
      entry.bytes(1, k).message(2, value);  // map<string, Value> entry
      session.message(1, entry);
    }
    session.fixed64(5, now());  // SessionStartInfo.start_time_secs
    detail::Proto experiment_data, session_data;
    experiment_data.message(2, experiment);  // HParamsPluginData{experiment}
    session_data.message(3, session);        // HParamsPluginData{session_start_info}
    summary.message(1, detail::plugin_value("_hparams_/experiment", "hparams", experiment_data.str()));
    summary.message(1, detail::plugin_value("_hparams_/session_start_info", "hparams", session_data.str()));
    write_summary(summary, 0);
  }
  void log(const Values& values, std::int64_t step) override {
    detail::Proto summary;
    for (const auto& [k, v] : values) {
      if (const auto* s = std::get_if<std::string>(&v)) {
        summary.message(1, detail::text_value(k, *s));
        continue;
      }
      detail::Proto value;
      value.bytes(1, k).fixed32(2, float(as_double(v)));
      summary.message(1, value);
    }
    write_summary(summary, step);
  }
  void finish() override { out_.close(); }
  //! The event file it writes.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void write_summary(const detail::Proto& summary, std::int64_t step) {
    detail::Proto event;
    event.fixed64(1, now()).varint(2, std::uint64_t(step)).message(5, summary);
    write(event.str());
  }
  void write(const std::string& data) {
    const std::string length = detail::le_bytes(data.size(), 8);
    out_ << length << detail::le_bytes(masked_crc32c(length), 4) << data << detail::le_bytes(masked_crc32c(data), 4);
    out_.flush();
    if (!out_) throw Error("accel: tracking: could not write " + path_.string());
  }

  std::filesystem::path path_;
  std::ofstream out_;
  bool config_kept_ = false;  // a resumed job's: the earlier event file's configuration (at step 0) stays
};

//! The records of a TFRecord file (an event file), each checked: the framing, the length's CRC and the data's.
inline std::vector<std::string> read_records(const std::filesystem::path& path) {
  const auto bytes = read_file(path, std::filesystem::file_size(path));
  const std::string all(bytes.begin(), bytes.end());
  auto u = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(all[at + std::size_t(i)]);
    return v;
  };
  std::vector<std::string> out;
  for (std::size_t at = 0; at < all.size();) {
    auto fail = [&](const std::string& what) {
      throw FileError(path.string(),
                      "record " + std::to_string(out.size()) + " at byte " + std::to_string(at) + ": " + what);
    };
    if (all.size() - at < 12) fail("truncated (fewer than 12 bytes of framing)");
    const std::uint64_t n = u(at, 8);
    if (u(at + 8, 4) != masked_crc32c(std::string_view(all).substr(at, 8))) fail("the length's CRC does not match");
    if (n > all.size() - at - 12 || all.size() - at - 12 - n < 4) fail("truncated (the data runs past the file's end)");
    std::string data = all.substr(at + 12, n);
    if (u(at + 12 + n, 4) != masked_crc32c(data)) fail("the data's CRC does not match");
    out.push_back(std::move(data));
    at += 16 + n;
  }
  return out;
}

}  // namespace accel::tracking
