#pragma once
//! \file
//! The definition of `Trackers`' constructor (tracking/trackers.hpp, included at its end): the one place that names the
//! writers (tracking/jsonl.hpp, csv.hpp, tensorboard.hpp), whose headers stay out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/core/files.hpp>
#include <accel/tracking/csv.hpp>
#include <accel/tracking/jsonl.hpp>
#include <accel/tracking/tensorboard.hpp>
#include <accel/tracking/trackers.hpp>

namespace accel::tracking {

ACCEL_DECL Trackers::Trackers(const std::vector<Tracker>& kinds, const std::filesystem::path& dir, const Values& config,
                              const Start& start)
    : position_(start.from.value_or(Position{})), known_(!start.continuing || start.from) {
  check_names(config, "init_trackers");
  for (std::size_t i = 0; i < kinds.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (kinds[i] == kinds[j]) throw InvalidArgument("accel: Options::log_with names a tracker twice");
  if (kinds.empty()) return;
  std::filesystem::create_directories(dir);
  for (const auto k : kinds) {
    if (k == Tracker::jsonl)
      writers_.push_back(std::make_unique<JsonlWriter>(dir, start));
    else if (k == Tracker::csv)
      writers_.push_back(std::make_unique<CsvWriter>(dir, start));
    else
      writers_.push_back(std::make_unique<TensorBoardWriter>(dir, start));
  }
  write_file_atomically(dir / config_file, detail::json_object(config, std::nullopt, /*pretty=*/true) + "\n");
  for (auto& w : writers_) w->store_config(config);
}

}  // namespace accel::tracking
