// Experiment trackers (tracking/): the JSONL and CSV files, a CSV table widened by a new name, TensorBoard's
// record framing and CRC32C, the Accelerator's init_trackers / log / end_training, and a job resumed from a
// checkpoint, whose files end as an uninterrupted job's. (The event files read by TensorBoard itself:
// tests/interop/check_tensorboard.py.)
#include "../../support/files.hpp"

#include <accel/accelerator.hpp>
#include <accel/checkpoint/format.hpp>
#include <accel/checkpoint/manifest.hpp>
#include <accel/tracking/trackers.hpp>

#include <torch/serialize/archive.h>

#include <unistd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace tr = accel::tracking;

namespace {

fs::path tracking_scratch(const std::string& name) { return test_files::scratch("tracking", name); }
using test_files::lines_of;

fs::path event_file(const fs::path& dir) {
  fs::path found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) {
      CHECK(found.empty());  // one event file per run
      found = e.path();
    }
  REQUIRE_FALSE(found.empty());
  return found;
}

struct Solo : accel::Accelerator<accel::dist::none> {};

// An event's step: the writer puts `wall_time` (field 1, fixed64) first, then `step` (field 2, varint).
std::int64_t event_step(const std::string& record) {
  REQUIRE(record.size() > 10);
  REQUIRE(record[0] == '\x09');
  REQUIRE(record[9] == '\x10');
  std::uint64_t v = 0;
  for (std::size_t i = 10, shift = 0; i < record.size(); ++i, shift += 7) {
    v |= std::uint64_t(static_cast<unsigned char>(record[i]) & 0x7F) << shift;
    if (!(static_cast<unsigned char>(record[i]) & 0x80)) break;
  }
  return std::int64_t(v);
}
// `SessionLog{status: START}` as the Event's field 7 (the record's end).
bool is_session_start(const std::string& record) { return record.ends_with(std::string("\x3a\x02\x08\x01", 4)); }

// The event files of a run's folder, in TensorBoard's order (by name).
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Step s's values: a text at step 3, a column from step 7 on, an empty text at step 8.
tr::Values values_at(int s) {
  tr::Values v{{"loss", 1.0 / (s + 1)}};
  if (s == 3) v["phase"] = "warm, \"up\"";
  if (s >= 7) v["acc"] = 0.1 * s;
  if (s == 8) v["note"] = "";
  return v;
}
// Logs steps [from, to): even steps given, odd ones left out (then the step is the number of calls before).
void log_steps(Solo& acc, int from, int to) {
  for (int s = from; s < to; ++s) acc.log(values_at(s), s % 2 == 0 ? std::optional<std::int64_t>(s) : std::nullopt);
}
const std::vector<tr::Tracker> every_tracker{tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard};

}  // namespace

TEST_CASE("tracking: CRC32C is the Castagnoli CRC, masked as TFRecord masks it", "[tracking]") {
  CHECK(tr::crc32c("123456789") == 0xE3069283u);  // the check value of CRC-32C
  CHECK(tr::crc32c("") == 0u);
  const std::uint32_t c = tr::crc32c("abc");
  CHECK(tr::masked_crc32c("abc") == ((c >> 15 | c << 17) + 0xA282EAD8u));
}

TEST_CASE("tracking: JSONL has one object per log call, CSV one row, widened by a new name", "[tracking]") {
  const auto dir = tracking_scratch("files");
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {{"lr", 0.001}, {"optimizer", "adamw"}});
    t.log({{"loss", 0.5}, {"acc", std::int64_t(3)}}, 10);
    t.log({{"loss", 0.25}, {"acc", std::int64_t(4)}, {"note", "a, \"b\""}}, 20);
    t.log({{"loss", 0.125}}, std::nullopt);  // the third call: step 2
    t.finish();
  }
  const auto jsonl = lines_of(dir / "metrics.jsonl");
  REQUIRE(jsonl.size() == 3);
  CHECK(jsonl[0] == R"({"step":10,"acc":3,"loss":0.5})");
  CHECK(nlohmann::json::parse(jsonl[1])["note"] == "a, \"b\"");
  CHECK(nlohmann::json::parse(jsonl[2])["step"] == 2);
  CHECK(lines_of(dir / "metrics.csv") ==
        std::vector<std::string>{"step,acc,loss,note", "10,3,0.5,", "20,4,0.25,\"a, \"\"b\"\"\"", "2,,0.125,"});
  CHECK(nlohmann::json::parse(std::ifstream(dir / "config.json")) ==
        nlohmann::json{{"lr", 0.001}, {"optimizer", "adamw"}});
  CHECK_FALSE(fs::exists(dir / "metrics.csv.tmp"));
}

TEST_CASE("tracking: TensorBoard records are framed and checksummed, the file version first", "[tracking]") {
  const auto dir = tracking_scratch("tb");
  {
    tr::Trackers t({tr::Tracker::tensorboard}, dir, {{"lr", 0.001}});
    for (int s = 0; s < 5; ++s) t.log({{"loss", 1.0 / (s + 1)}}, s);
  }
  const auto path = event_file(dir);
  const auto records = tr::read_records(path);
  REQUIRE(records.size() == 1 + 1 + 1 + 5);  // version, session start, config, 5 steps
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK((is_session_start(records[1]) && event_step(records[1]) == 0));  // a fresh run: every earlier step purged
  CHECK(records[2].find("config") != std::string::npos);
  CHECK(records[2].find("text") != std::string::npos);
  // A flipped byte or a cut file is found.
  const std::string bytes = test_files::bytes_of(path);
  auto damaged = bytes;
  damaged[bytes.size() - 6] ^= 0x10;
  std::ofstream(dir / "damaged", std::ios::binary) << damaged;
  CHECK_THROWS_WITH(tr::read_records(dir / "damaged"),
                    Catch::Contains("record 7") && Catch::Contains("the data's CRC does not match"));
  std::ofstream(dir / "cut", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  CHECK_THROWS_WITH(tr::read_records(dir / "cut"), Catch::Contains("truncated"));
}

TEST_CASE("tracking: the Accelerator's init_trackers, log and end_training", "[tracking][accelerator]") {
  const auto root = tracking_scratch("acc");
  Solo acc{accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard},
                          .logging_dir = root}};
  CHECK_THROWS_WITH(acc.log({{"loss", 1.0}}, 0), Catch::Contains("call init_trackers first"));
  acc.init_trackers("run", {{"batch_size", 16}});
  CHECK_THROWS_WITH(acc.log({{"step", 1.0}}, 0), Catch::Contains("names must be non-empty and not \"step\""));
  for (int s = 0; s < 3; ++s) acc.log({{"loss", 0.5 * s}, {"epoch", s / 2}}, s);
  acc.end_training();
  CHECK(lines_of(root / "run" / "metrics.jsonl").size() == 3);
  CHECK(lines_of(root / "run" / "metrics.csv").size() == 4);
  CHECK(tr::read_records(event_file(root / "run")).size() == 6);  // version, session start, config, 3 steps
  CHECK_THROWS_WITH(acc.log({{"loss", 1.0}}, 3), Catch::Contains("call init_trackers first"));  // ended
  Solo none{accel::Options{.logging_dir = root / "none"}};
  none.init_trackers("run");  // no tracker named: nothing is written
  none.log({{"loss", 1.0}});
  none.end_training();
  CHECK_FALSE(fs::exists(root / "none"));
}

TEST_CASE("tracking: a resumed job continues its run's JSONL and CSV files; a fresh one starts them anew",
          "[tracking]") {
  const auto dir = tracking_scratch("continued");
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {});
    t.log({{"loss", 0.5}, {"a, \"b\"", std::int64_t(1)}}, 1);
    t.log({{"loss", 0.25}, {"note", "x\ny"}}, 2);  // a field with a line break
  }
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {}, /*continuing=*/true);
    t.log({{"loss", 0.125}, {"acc", 0.75}}, 3);  // a new column: every earlier row is kept and widened
  }
  CHECK(lines_of(dir / "metrics.jsonl").size() == 3);
  CHECK(lines_of(dir / "metrics.csv") == std::vector<std::string>{"step,\"a, \"\"b\"\"\",loss,note,acc", "1,1,0.5,,",
                                                                  "2,,0.25,\"x", "y\",", "3,,0.125,,0.75"});
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {});
    t.log({{"loss", 1.0}}, 0);
  }
  CHECK(lines_of(dir / "metrics.jsonl").size() == 1);
  CHECK(lines_of(dir / "metrics.csv") == std::vector<std::string>{"step,loss", "0,1"});
  {
    std::ofstream(dir / "metrics.csv") << "epoch,loss\n0,1\n";
    CHECK_THROWS_WITH(tr::Trackers({tr::Tracker::csv}, dir, {}, true),
                      Catch::Contains("is not a metrics table of accel"));
  }
}

TEST_CASE(
    "tracking: a job resumed from a checkpoint ends with an uninterrupted job's files (what the stopped one "
    "logged after its checkpoint dropped)",
    "[tracking][trackers][accelerator]") {
  const auto root = tracking_scratch("resume");
  auto options = [&](const std::string& where) {
    return accel::Options{.log_with = every_tracker, .logging_dir = root / where};
  };
  const tr::Values config{{"lr", 0.5}};
  {  // uninterrupted: steps 0..9; the files as they are after step 5 are kept aside
    Solo acc{options("straight")};
    acc.init_trackers("run", config);
    log_steps(acc, 0, 6);
    fs::copy_file(root / "straight" / "run" / "metrics.jsonl", root / "at_5.jsonl");
    fs::copy_file(root / "straight" / "run" / "metrics.csv", root / "at_5.csv");
    log_steps(acc, 6, 10);
    acc.end_training();
  }
  {  // stopped: a checkpoint after step 5, then steps 6..9 logged and the job "crashes" (no end_training)
    Solo acc{options("resumed")};
    acc.init_trackers("run", config);
    log_steps(acc, 0, 6);
    acc.save_state(root / "checkpoint");
    log_steps(acc, 6, 10);
  }
  const auto run = root / "resumed" / "run";
  REQUIRE(lines_of(run / "metrics.jsonl").size() == 10);
  Solo acc{options("resumed")};
  acc.load_state(root / "checkpoint");
  acc.init_trackers("run", config);
  // The rows the stopped job logged after its checkpoint are gone, and the column only they used.
  CHECK(test_files::bytes_of(run / "metrics.jsonl") == test_files::bytes_of(root / "at_5.jsonl"));
  CHECK(test_files::bytes_of(run / "metrics.csv") == test_files::bytes_of(root / "at_5.csv"));
  CHECK_FALSE(fs::exists(run / "metrics.jsonl.tmp"));
  log_steps(acc, 6, 10);  // the odd steps, left out, go on counting from the checkpoint's 6 calls
  acc.end_training();
  for (const char* file : {"metrics.jsonl", "metrics.csv", "config.json"})
    CHECK(test_files::bytes_of(run / file) == test_files::bytes_of(root / "straight" / "run" / file));
  CHECK(lines_of(run / "metrics.csv").front() == "step,loss,phase,acc,note");
  CHECK(lines_of(run / "metrics.csv")[9].ends_with(",\"\""));  // step 8's empty text: not a name left out
  // TensorBoard: the resumed job's event file starts at step 6 and purges every step from 6 on (TensorBoard reads the
  // folder's files in name order: the new one is last); the configuration at step 0 stays the first file's.
  const auto files = event_files(run);
  REQUIRE(files.size() == 2);
  const auto first = tr::read_records(files[0]), second = tr::read_records(files[1]);
  REQUIRE(first.size() == 3 + 10);
  CHECK((is_session_start(first[1]) && event_step(first[1]) == 0));
  REQUIRE(second.size() == 2 + 4);  // version, session start, steps 6..9
  CHECK(second[0].find("brain.Event:2") != std::string::npos);
  CHECK(event_step(second[0]) == 6);
  CHECK((is_session_start(second[1]) && event_step(second[1]) == 6));
  for (int s = 6; s < 10; ++s) CHECK(event_step(second[std::size_t(s - 4)]) == s);
}

TEST_CASE(
    "tracking: a checkpoint without the trackers' position continues the files as they are; a damaged one is "
    "an error naming the file and the field",
    "[tracking][trackers][accelerator]") {
  const auto root = tracking_scratch("old_checkpoint");
  const auto ckpt = root / "checkpoint";
  const auto meta_path = ckpt / accel::checkpoint::meta_file;
  {
    Solo acc{accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv}, .logging_dir = root}};
    acc.init_trackers("run");
    log_steps(acc, 0, 6);
    acc.save_state(ckpt);
    log_steps(acc, 6, 10);
  }
  const auto saved = accel::checkpoint::describe(ckpt);
  REQUIRE(saved.trackers == tr::Position{6, 5});
  // The description as an earlier accel wrote it, or damaged: rewritten with its manifest.
  auto rewrite = [&](std::optional<tr::Position> trackers, const std::string& extra_key = "") {
    auto m = saved;
    m.trackers = trackers;
    torch::serialize::OutputArchive a;
    accel::checkpoint::write_meta(a, m);
    if (!extra_key.empty()) accel::checkpoint::write(a, extra_key, 3);
    a.save_to(meta_path.string());
    accel::checkpoint::Manifest::of_directory(ckpt).write(ckpt);
  };
  auto load_error = [&] {
    Solo acc{accel::Options{.logging_dir = root / "none"}};
    try {
      acc.load_state(ckpt);
    } catch (const accel::FileError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  rewrite(tr::Position{-1, std::nullopt});
  CHECK_THAT(load_error(), Catch::Contains(meta_path.string()) && Catch::Contains("'tracker_calls' is -1"));
  rewrite(tr::Position{2, std::nullopt});
  CHECK_THAT(load_error(), Catch::Contains(meta_path.string()) &&
                               Catch::Contains("'tracker_calls' is 2 without a 'tracker_last_step'"));
  rewrite(tr::Position{0, 4});
  CHECK_THAT(load_error(), Catch::Contains("'tracker_calls' is 0 with a 'tracker_last_step'"));
  rewrite(std::nullopt, "tracker_last_step");
  CHECK_THAT(load_error(), Catch::Contains("'tracker_last_step' without 'tracker_calls'"));
  // Steps that do not match the file's rows: the files are not the checkpoint's run's.
  rewrite(tr::Position{6, 4});
  {
    Solo acc{accel::Options{.log_with = {tr::Tracker::jsonl}, .logging_dir = root}};
    acc.load_state(ckpt);
    CHECK_THROWS_WITH(acc.init_trackers("run"),
                      Catch::Contains("metrics.jsonl: line 6, the last row logged before the "
                                      "checkpoint, has step 5, the checkpoint's last step is 4"));
  }
  {
    Solo acc{accel::Options{.log_with = {tr::Tracker::csv}, .logging_dir = root}};
    acc.load_state(ckpt);
    CHECK_THROWS_WITH(acc.init_trackers("run"),
                      Catch::Contains("metrics.csv: row 6, the last row logged before the checkpoint, has step 5"));
  }
  // No position recorded: nothing is dropped, the files are appended to (and the position stays unknown).
  rewrite(std::nullopt);
  Solo acc{accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv}, .logging_dir = root}};
  acc.load_state(ckpt);
  acc.init_trackers("run");
  log_steps(acc, 6, 10);
  acc.end_training();
  CHECK(lines_of(root / "run" / "metrics.jsonl").size() == 14);
  CHECK(lines_of(root / "run" / "metrics.csv").size() == 15);
  acc.save_state(root / "later");
  CHECK_FALSE(accel::checkpoint::describe(root / "later").trackers.has_value());
}

TEST_CASE(
    "tracking: resuming drops a line cut by a crash, keeps a file with fewer rows, and starts from a checkpoint "
    "saved before the first log call",
    "[tracking][trackers]") {
  const auto dir = tracking_scratch("cut");
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {});
    for (int s = 0; s < 4; ++s) t.log(values_at(s), s);
    CHECK(t.position() == tr::Position{4, 3});
  }
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << R"({"step":4,"lo)";  // a crash in the middle of a row
  {
    tr::Trackers t({tr::Tracker::jsonl}, dir, {}, tr::Start{.continuing = true, .from = tr::Position{6, 5}});
    CHECK(lines_of(dir / "metrics.jsonl").size() == 4);  // 4 rows of the 6 the checkpoint counted: all kept
    t.log({{"loss", 0.5}}, std::nullopt);                // the 7th call: step 6
    CHECK(t.position() == tr::Position{7, 6});
  }
  CHECK(lines_of(dir / "metrics.jsonl").back() == R"({"step":6,"loss":0.5})");
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {},
                   tr::Start{.continuing = true, .from = tr::Position{}});
    CHECK(t.position() == tr::Position{});
  }
  CHECK(lines_of(dir / "metrics.jsonl").empty());
  CHECK(lines_of(dir / "metrics.csv") == std::vector<std::string>{"step"});
  CHECK(tr::Trackers({}, dir, {}, /*continuing=*/true).position() == std::nullopt);
  CHECK(tr::Trackers::at(tr::Position{3, 9}).position() == tr::Position{3, 9});
}
