#pragma once
//! \file
//! Reading and writing whole files, with errors that name the file (`FileError`): what checkpoints, manifests
//! and the trackers' files share.

#include <accel/error.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace accel {

//! The first `size` bytes of `path` (the caller knows the size, and bounds it: nothing larger is allocated).
[[nodiscard]] inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path, std::uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint8_t> bytes(size);
  if (!in || !in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size)))
    throw FileError(path.string(), "cannot read " + std::to_string(size) + " bytes");
  return bytes;
}

//! Writes `text` to `path` whole: into `<path>.tmp`, renamed over `path`, so a reader never sees it half written.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
    out.close();
    if (!out) throw FileError(tmp.string(), "cannot be written");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace accel
