#pragma once
// Files in tests: a fresh scratch folder per test, and a file's bytes or lines.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace test_files {

//! `<tmp>/accel_<area>_<pid>/<name>`, empty and created.
inline std::filesystem::path scratch(const std::string& area, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("accel_" + area + "_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string bytes_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace test_files
