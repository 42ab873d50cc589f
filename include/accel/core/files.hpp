#pragma once
//! \file
//! Reading and writing whole files, with errors that name the file (`FileError`): what checkpoints, manifests
//! and the trackers' files share.

#include <accel/error.hpp>

#include <fcntl.h>   // open
#include <unistd.h>  // write, fsync, close

#include <cerrno>
#include <cstdint>
#include <cstring>
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

//! Writes `text` to `path` whole: into `<path>.tmp` in the same folder, flushed to the disk (fsync), then renamed
//! over `path`, so that a reader (or a crash) never finds it half written.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw FileError(tmp.string(), std::string("cannot be created: ") + std::strerror(errno));
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    throw FileError(tmp.string(), std::string(what) + std::strerror(e));
  };
  for (std::size_t done = 0; done < text.size();) {
    const ::ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot be written: ");
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0) fail("cannot be flushed to the disk: ");
  if (::close(fd) != 0) throw FileError(tmp.string(), std::string("cannot be written: ") + std::strerror(errno));
  std::filesystem::rename(tmp, path);
}

}  // namespace accel
