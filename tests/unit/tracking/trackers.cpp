// Experiment trackers (tracking/): the JSONL and CSV files, a CSV table widened by a new name, TensorBoard's
// record framing and CRC32C, and the Accelerator's init_trackers / log / end_training. (The event files read by
// TensorBoard itself: tests/interop/tensorboard_check.py.)
#include "../../support/files.hpp"

#include <accel/accelerator.hpp>
#include <accel/tracking/trackers.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
  CHECK(nlohmann::json::parse(std::ifstream(dir / "config.json")) == nlohmann::json{{"lr", 0.001}, {"optimizer", "adamw"}});
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
  REQUIRE(records.size() == 1 + 1 + 5);  // version, config, 5 steps
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(records[1].find("config") != std::string::npos);
  CHECK(records[1].find("text") != std::string::npos);
  // A flipped byte or a cut file is found.
  const std::string bytes = test_files::bytes_of(path);
  auto damaged = bytes;
  damaged[bytes.size() - 6] ^= 0x10;
  std::ofstream(dir / "damaged", std::ios::binary) << damaged;
  CHECK_THROWS_WITH(tr::read_records(dir / "damaged"), Catch::Contains("record 6") && Catch::Contains("the data's CRC does not match"));
  std::ofstream(dir / "cut", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  CHECK_THROWS_WITH(tr::read_records(dir / "cut"), Catch::Contains("truncated"));
}

TEST_CASE("tracking: the Accelerator's init_trackers, log and end_training", "[tracking][accelerator]") {
  const auto root = tracking_scratch("acc");
  Solo acc{accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard}, .logging_dir = root}};
  CHECK_THROWS_WITH(acc.log({{"loss", 1.0}}, 0), Catch::Contains("call init_trackers first"));
  acc.init_trackers("run", {{"batch_size", 16}});
  CHECK_THROWS_WITH(acc.log({{"step", 1.0}}, 0), Catch::Contains("names must be non-empty and not \"step\""));
  for (int s = 0; s < 3; ++s) acc.log({{"loss", 0.5 * s}, {"epoch", s / 2}}, s);
  acc.end_training();
  CHECK(lines_of(root / "run" / "metrics.jsonl").size() == 3);
  CHECK(lines_of(root / "run" / "metrics.csv").size() == 4);
  CHECK(tr::read_records(event_file(root / "run")).size() == 5);
  CHECK_THROWS_WITH(acc.log({{"loss", 1.0}}, 3), Catch::Contains("call init_trackers first"));  // ended
  Solo none{accel::Options{.logging_dir = root / "none"}};
  none.init_trackers("run");  // no tracker named: nothing is written
  none.log({{"loss", 1.0}});
  none.end_training();
  CHECK_FALSE(fs::exists(root / "none"));
}

TEST_CASE("tracking: a resumed job continues its run's JSONL and CSV files; a fresh one starts them anew", "[tracking]") {
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
  CHECK(lines_of(dir / "metrics.csv") ==
        std::vector<std::string>{"step,\"a, \"\"b\"\"\",loss,note,acc", "1,1,0.5,,", "2,,0.25,\"x", "y\",", "3,,0.125,,0.75"});
  {
    tr::Trackers t({tr::Tracker::jsonl, tr::Tracker::csv}, dir, {});
    t.log({{"loss", 1.0}}, 0);
  }
  CHECK(lines_of(dir / "metrics.jsonl").size() == 1);
  CHECK(lines_of(dir / "metrics.csv") == std::vector<std::string>{"step,loss", "0,1"});
  {
    std::ofstream(dir / "metrics.csv") << "epoch,loss\n0,1\n";
    CHECK_THROWS_WITH(tr::Trackers({tr::Tracker::csv}, dir, {}, true), Catch::Contains("is not a metrics table of accel"));
  }
}
