#pragma once
//! \file
//! The checkpoint policy of a project: Accelerate's `ProjectConfiguration` and the folder it manages.
//!
//! \code
//! <project_dir>/
//!   checkpoints/
//!     checkpoint_0/ checkpoint_1/ ...   `save_state()` with automatic naming: checkpoint_<iteration>
//!     checkpoint_7.partial/             one being written (never chosen by `load_state()`)
//!   <project_name>/                     the trackers' files (`init_trackers`), under logging_dir
//! \endcode
//!
//! A checkpoint is complete once its manifest is written and it carries its final name (checkpointer.hpp writes
//! into `<dir>.partial` and renames it last), so "the latest checkpoint" is the highest-numbered
//! `checkpoint_<n>` folder holding a manifest. Older complete ones beyond `total_limit` are removed only after a
//! new one is complete (Accelerate removes them before writing the new one).

#include <accel/checkpoint/manifest.hpp>
#include <accel/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace accel::checkpoint {

// [accelerate:utils/dataclasses.py ProjectConfiguration]
//! Where a job keeps its checkpoints and logs, and how `save_state()` names and prunes checkpoints
//! (`accel::ProjectConfiguration`, `Options::project_config`).
struct ProjectConfiguration {
  std::filesystem::path project_dir = ".";   //!< the project's root
  std::filesystem::path logging_dir{};       //!< trackers write here (empty: `project_dir`)
  bool automatic_checkpoint_naming = false;  //!< `save_state()` / `load_state()` without a directory
  std::optional<int> total_limit{};          //!< keep at most this many complete checkpoints (unset: all)
  std::int64_t iteration = 0;                //!< the number the next `save_state()` uses
};

//! One `checkpoint_<n>` folder of a project.
struct Numbered {
  std::int64_t number = 0;     //!< its `<n>`
  std::filesystem::path path;  //!< the folder
};

//! `<project_dir>/checkpoints`.
inline std::filesystem::path checkpoints_dir(const ProjectConfiguration& p) { return p.project_dir / "checkpoints"; }
//! `<project_dir>/checkpoints/checkpoint_<n>`.
inline std::filesystem::path numbered_dir(const ProjectConfiguration& p, std::int64_t n) {
  return checkpoints_dir(p) / ("checkpoint_" + std::to_string(n));
}

//! `n` for a folder named `checkpoint_<n>` (digits only); nothing for any other name (`checkpoint_3.partial`,
//! `checkpoint_3.old`, `notes`).
inline std::optional<std::int64_t> checkpoint_number(const std::string& name) {
  constexpr std::string_view prefix = "checkpoint_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  std::int64_t n = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || end != last || n < 0 || *first == '+' || *first == '-') return std::nullopt;
  return n;
}

//! The complete checkpoints of a project (a manifest in a `checkpoint_<n>` folder), oldest first.
inline std::vector<Numbered> complete_checkpoints(const ProjectConfiguration& p) {
  std::vector<Numbered> out;
  std::error_code ec;
  const auto root = checkpoints_dir(p);
  if (!std::filesystem::is_directory(root, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const auto n = checkpoint_number(entry.path().filename().string());
    if (n && entry.is_directory(ec) && std::filesystem::is_regular_file(entry.path() / manifest_file, ec))
      out.push_back({*n, entry.path()});
  }
  std::sort(out.begin(), out.end(), [](const Numbered& a, const Numbered& b) { return a.number < b.number; });
  return out;
}

//! The latest complete checkpoint of a project, if any.
inline std::optional<Numbered> latest_checkpoint(const ProjectConfiguration& p) {
  auto all = complete_checkpoints(p);
  if (all.empty()) return std::nullopt;
  return all.back();
}

//! Checks a project configuration (every process, at construction).
inline void check_project(const ProjectConfiguration& p) {
  accel::detail::require(!p.project_dir.empty(),
                         "accel: ProjectConfiguration::project_dir is empty; leave it at \".\" or name a folder");
  accel::detail::require(!p.total_limit || *p.total_limit >= 1,
                         "accel: ProjectConfiguration::total_limit is " +
                             (p.total_limit ? std::to_string(*p.total_limit) : std::string()) +
                             "; keep at least 1 checkpoint, or leave it unset to keep all");
  accel::detail::require(p.iteration >= 0, "accel: ProjectConfiguration::iteration is " + std::to_string(p.iteration) +
                                               "; it numbers checkpoints from 0");
}

//! The folder the next `save_state()` writes, or why there is none: automatic naming off, or the folder exists
//! already (a fresh job in a project with checkpoints: it would overwrite one).
inline std::filesystem::path next_checkpoint_dir(const ProjectConfiguration& p) {
  accel::detail::require(
      p.automatic_checkpoint_naming,
      "accel::Accelerator::save_state: no directory given and ProjectConfiguration::automatic_checkpoint_naming is "
      "off; pass a directory, or set Options::project_config.automatic_checkpoint_naming = true");
  const auto dir = numbered_dir(p, p.iteration);
  const auto latest = latest_checkpoint(p);
  const bool behind = latest && latest->number >= p.iteration;  // a fresh job in a project with checkpoints
  accel::detail::require(
      !behind && !std::filesystem::exists(dir),
      "accel::Accelerator::save_state: " +
          (behind ? "the project holds checkpoints up to " + latest->path.string() : dir.string() + " exists already") +
          " and ProjectConfiguration::iteration is " + std::to_string(p.iteration) +
          ": saving would overwrite or outnumber them; resume with load_state() first (it continues the "
          "numbering), set ProjectConfiguration::iteration past the last checkpoint, or use another project_dir");
  return dir;
}

//! The checkpoint `load_state()` reads: the latest complete one.
inline Numbered checkpoint_to_resume(const ProjectConfiguration& p) {
  accel::detail::require(
      p.automatic_checkpoint_naming,
      "accel::Accelerator::load_state: no directory given and ProjectConfiguration::automatic_checkpoint_naming is "
      "off; pass the checkpoint's directory, or set Options::project_config.automatic_checkpoint_naming = true");
  auto latest = latest_checkpoint(p);
  accel::detail::require(latest.has_value(),
                         "accel::Accelerator::load_state: no complete checkpoint under " + checkpoints_dir(p).string() +
                             " (a checkpoint_<n> folder with a manifest); check project_dir, or start without "
                             "load_state() (Accelerator::latest_checkpoint() says whether there is one)");
  return *latest;
}

//! After `saved` is complete: removes the oldest complete checkpoints beyond `total_limit`, and the unfinished
//! folders (`checkpoint_<n>.partial`) that interrupted saves left. Main process only. Returns
//! what could not be removed (the job goes on: a warning, not an error).
inline std::vector<std::string> prune_checkpoints(const ProjectConfiguration& p, std::int64_t saved) {
  std::vector<std::string> problems;
  auto remove = [&](const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec) problems.push_back("could not remove " + dir.string() + ": " + ec.message());
  };
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints_dir(p), ec)) {
    const auto name = entry.path().filename().string();
    constexpr std::string_view suffix = ".partial";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    if (checkpoint_number(name.substr(0, name.size() - suffix.size()))) remove(entry.path());
  }
  if (!p.total_limit) return problems;
  auto others = complete_checkpoints(p);  // the new one stays, whatever its number
  std::erase_if(others, [&](const Numbered& c) { return c.number == saved; });
  for (std::size_t i = 0; i + std::size_t(*p.total_limit) < others.size() + 1; ++i) remove(others[i].path);
  return problems;
}

}  // namespace accel::checkpoint
