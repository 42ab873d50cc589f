#pragma once
//! \file
//! The checkpoint manifest: every file of a checkpoint directory with its size and CRC-32C, written last (by the
//! main process, once every process has written its files) and verified by `load_state` before anything is read.
//!
//! ```
//! accel-checkpoint-manifest 1
//! 1f0c3a9e 48213 accel_checkpoint.pt        <crc32c, 8 hex digits> <size in bytes> <file name>, sorted by name
//! ...
//! end 6 5d2e0c41                            the number of files and the CRC-32C of every line above
//! ```
//!
//! A directory without a complete manifest (the save did not finish, or the manifest itself is damaged) is never
//! loaded. A listed file that is missing, of another size or another checksum stops the load with a
//! `FileError` naming it. A file in the directory that the manifest does not list is ignored: the readers take
//! their bytes only through the manifest (`Manifest::read`), so such a file is never read.
//!
//! Why CRC-32C: it catches truncation, torn writes and flipped bits (not tampering: a checkpoint is trusted as
//! much as the directory it lives in), and it runs at about 3 GB/s on one core (core/crc32c.hpp): for 40 MiB of
//! parameters the manifest adds about 35 ms to a save (every file read back and summed) and 13 ms to a load (each file
//! is read once, summed, and handed to LibTorch from memory).

#include <accel/core/crc32c.hpp>
#include <accel/core/files.hpp>
#include <accel/error.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace accel::checkpoint {

using accel::crc32c;

inline constexpr const char* manifest_file = "manifest.txt";  //!< the manifest's name, written last

//! The files of one checkpoint directory, their sizes and checksums.
struct Manifest {
  //! One file of the checkpoint.
  struct Entry {
    std::string name;        //!< the file's name in the checkpoint directory
    std::uint64_t size = 0;  //!< its size in bytes
    std::uint32_t crc = 0;   //!< its CRC-32C
  };
  std::vector<Entry> files;  //!< sorted by name, no duplicates

  //! A manifest larger than this is damage: a checkpoint lists a few files per model, optimizer and process.
  static constexpr std::uint64_t max_bytes = 4u << 20;

  //! A file name the manifest may list: one path component of [A-Za-z0-9._-], never "." or "..", so a damaged
  //! manifest cannot point a read outside its directory.
  [[nodiscard]] static bool valid_name(std::string_view name) {
    if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
    for (const char ch : name)
      if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
            ch == '_' || ch == '-'))
        return false;
    return true;
  }

  //! The entry of `name`; null if the manifest does not list it.
  [[nodiscard]] const Entry* find(std::string_view name) const {
    for (const auto& e : files)
      if (e.name == name) return &e;
    return nullptr;
  }

  //! The manifest's text, as written into `manifest.txt`.
  [[nodiscard]] std::string text() const {
    std::string out = "accel-checkpoint-manifest 1\n";
    char line[32];
    for (const auto& e : files) {
      std::snprintf(line, sizeof line, "%08x ", unsigned(e.crc));
      out += line + std::to_string(e.size) + " " + e.name + "\n";
    }
    std::snprintf(line, sizeof line, " %08x\n", unsigned(crc32c(out)));
    return out + "end " + std::to_string(files.size()) + line;
  }

  //! Parses a manifest's text; `path` names it in errors. Every field is checked before it is used.
  [[nodiscard]] static Manifest parse(std::string_view text, const std::string& path) {
    auto fail = [&](const std::string& what) { throw FileError(path, "damaged checkpoint manifest: " + what); };
    Manifest m;
    std::size_t pos = 0, line_no = 0;
    auto next_line = [&]() -> std::string_view {
      const auto end = text.find('\n', pos);
      if (end == std::string_view::npos)
        fail("line " + std::to_string(line_no + 1) + " is not terminated (truncated?)");
      const auto line = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      return line;
    };
    // A decimal number of at most `digits` digits, the whole of `s`.
    auto number = [&](std::string_view s, std::size_t digits, const char* what) {
      if (s.empty() || s.size() > digits) fail(std::string("line ") + std::to_string(line_no) + ": bad " + what);
      std::uint64_t v = 0;
      for (const char ch : s) {
        if (ch < '0' || ch > '9') fail(std::string("line ") + std::to_string(line_no) + ": bad " + what);
        v = v * 10 + std::uint64_t(ch - '0');
      }
      return v;
    };
    auto hex32 = [&](std::string_view s) {
      if (s.size() != 8) fail("line " + std::to_string(line_no) + ": bad checksum");
      std::uint32_t v = 0;
      for (const char ch : s) {
        const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) fail("line " + std::to_string(line_no) + ": bad checksum");
        v = v << 4 | std::uint32_t(d);
      }
      return v;
    };
    if (next_line() != "accel-checkpoint-manifest 1") fail("the first line is not 'accel-checkpoint-manifest 1'");
    while (true) {
      const auto start = pos;
      const auto line = next_line();
      if (line.starts_with("end ")) {
        const auto rest = line.substr(4);
        const auto sp = rest.find(' ');
        if (sp == std::string_view::npos) fail("bad last line");
        if (number(rest.substr(0, sp), 9, "file count") != m.files.size())
          fail("the file count differs from the lines listed");
        if (hex32(rest.substr(sp + 1)) != crc32c(text.substr(0, start)))
          fail("its own checksum does not match its lines");
        if (pos != text.size()) fail("text after the last line");
        return m;
      }
      const auto s1 = line.find(' ');
      const auto s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
      if (s2 == std::string_view::npos) fail("line " + std::to_string(line_no) + " is not '<crc32c> <size> <name>'");
      Entry e;
      e.crc = hex32(line.substr(0, s1));
      e.size = number(line.substr(s1 + 1, s2 - s1 - 1), 19, "size");
      e.name = std::string(line.substr(s2 + 1));
      if (!valid_name(e.name)) fail("line " + std::to_string(line_no) + ": not a file name of a checkpoint");
      if (!m.files.empty() && !(m.files.back().name < e.name))
        fail("line " + std::to_string(line_no) + ": names out of order or repeated");
      m.files.push_back(std::move(e));
    }
  }

  //! Lists every regular file of `dir` except the manifest (the main process, once every process has written).
  [[nodiscard]] static Manifest of_directory(const std::filesystem::path& dir) {
    Manifest m;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      const auto name = f.path().filename().string();
      if (name == manifest_file || !f.is_regular_file()) continue;
      accel::detail::require(valid_name(name), "accel::save_state: " + f.path().string() +
                                                   ": a checkpoint file name must be of [A-Za-z0-9._-]");
      m.files.push_back(summed(f.path()));
    }
    std::sort(m.files.begin(), m.files.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
    return m;
  }

  //! Writes `dir/manifest.txt`: the file that makes the directory a complete checkpoint, so it goes last, whole
  //! (written aside, then renamed).
  void write(const std::filesystem::path& dir) const { write_file_atomically(dir / manifest_file, text()); }

  //! Reads and parses `dir/manifest.txt`; a checkpoint without one is incomplete.
  [[nodiscard]] static Manifest read(const std::filesystem::path& dir) {
    const auto path = dir / manifest_file;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec)
      throw FileError(path.string(),
                      "missing: the checkpoint is incomplete (its save did not finish) or was written by "
                      "an accel older than checkpoint format 2; it cannot be loaded as complete");
    if (size > max_bytes)
      throw FileError(path.string(), "damaged checkpoint manifest: " + std::to_string(size) + " bytes");
    const auto bytes = read_file(path, size);
    return parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
  }

  //! The bytes of `dir/name`, checked against the manifest (listed, same size, same CRC-32C) before they are
  //! returned; no read allocates more than the listed size, which is the size of the file on disk.
  [[nodiscard]] std::vector<std::uint8_t> read(const std::filesystem::path& dir, const std::string& name) const {
    const auto path = dir / name;
    const Entry* e = find(name);
    if (!e)
      throw FileError(path.string(),
                      "not listed in the checkpoint's manifest; the checkpoint was written by a job that "
                      "prepared other objects or processes, or its manifest is damaged");
    check_size(dir, *e);
    auto bytes = read_file(path, e->size);
    const auto crc = crc32c(bytes);
    if (crc != e->crc) {
      char msg[96];
      std::snprintf(msg, sizeof msg, "checksum mismatch: CRC-32C %08x, the manifest lists %08x (damaged)",
                    unsigned(crc), unsigned(e->crc));
      throw FileError(path.string(), msg);
    }
    return bytes;
  }

  //! Every listed file present with its listed size (the checksums are checked as each file is read).
  void check_sizes(const std::filesystem::path& dir) const {
    for (const auto& e : files) check_size(dir, e);
  }

 private:
  static void check_size(const std::filesystem::path& dir, const Entry& e) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(dir / e.name, ec);
    if (ec)
      throw FileError((dir / e.name).string(),
                      "missing: the manifest lists it with " + std::to_string(e.size) + " bytes");
    if (size != e.size)
      throw FileError((dir / e.name).string(), "size mismatch: " + std::to_string(size) +
                                                   " bytes, the manifest lists " + std::to_string(e.size) +
                                                   " (truncated or overwritten)");
  }
  // The entry of one file, summed in chunks: a save never holds a second copy of a large model in memory.
  static Entry summed(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(path.string(), "cannot be read back to sum it");
    std::vector<char> chunk(std::size_t(1) << 20);
    Entry e{path.filename().string(), 0, 0};
    while (in.read(chunk.data(), std::streamsize(chunk.size())) || in.gcount() > 0) {
      const auto n = std::size_t(in.gcount());
      e.crc = crc32c(std::string_view(chunk.data(), n), e.crc);
      e.size += n;
    }
    return e;
  }
};

}  // namespace accel::checkpoint
