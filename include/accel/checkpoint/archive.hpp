#pragma once
//! \file
//! Reading a LibTorch archive (`torch::serialize::InputArchive`: a zip of pickles and tensor records) from bytes
//! that may be damaged: `load_archive` is the one way accel opens one. It checks the zip structure and the pickles
//! first, then hands the bytes to LibTorch, and turns any LibTorch error into one `accel::FileError` naming the
//! file (without LibTorch's C++ backtrace).
//!
//! Note [What LibTorch does with a damaged archive]
//! LibTorch's zip reader (miniz, `PyTorchStreamReader::getRecord`) allocates a record's declared uncompressed size
//! before reading it, and its unpickler allocates a string's declared length (BINUNICODE8, BINBYTES8: 64-bit
//! lengths) and reserves its memo table by a declared index (LONG_BINPUT) before checking them against the data.
//! Both would let a few flipped bits ask for 2^62 bytes. So, before LibTorch sees the bytes:
//!  - `check_zip`: the end-of-central-directory record (zip64 too), every entry stored uncompressed (what
//!    LibTorch writes; a TorchScript source may be deflated, its declared size bounded), its local header, name and
//!    data inside the file and before the central directory, and no more entries than the directory can hold.
//!    Every record allocation is then bounded by the file's size (or 1 MiB for a deflated source).
//!  - no two entries of one name (LibTorch would read either);
//!  - `check_pickle` on every pickle member, run as LibTorch's unpickler would (Note [What a pickle can declare] in
//!    pickle.hpp): each length and memo index bounded by the pickle's own size, each storage exactly the size of
//!    its record, each tensor inside its storage.
//! What remains is LibTorch's: the TorchScript source in `code/` is compiled by its recursive-descent parser, which
//! a file crafted with thousands of nested brackets could drive into deep recursion; `check_zip` caps each stored
//! source record's bracket nesting (an archive written by accel nests a handful). LibTorch deflates some source
//! records; those are bounded in size (`max_source_bytes`) but their nesting is left to LibTorch's parser.

#include <accel/checkpoint/pickle.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel::checkpoint {

namespace detail {
inline std::uint64_t le(std::span<const std::uint8_t> b, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(b[at + i]) << (8 * i);
  return v;
}
[[noreturn]] inline void damaged(const std::string& path, const std::string& what) {
  throw FileError(path, "not a readable LibTorch archive: " + what);
}
}  // namespace detail

//! The largest TorchScript source record accepted: an archive written by accel holds a few hundred bytes each.
inline constexpr std::uint64_t max_source_bytes = 1u << 20;

//! Checks the zip structure of the archive `bytes` (named `path` in errors): see the note above.
inline void check_zip(std::span<const std::uint8_t> b, const std::string& path) {
  using detail::le;
  const std::size_t n = b.size();
  if (n < 22 || le(b, 0, 4) != 0x04034b50) detail::damaged(path, "no zip header (truncated, or not a .pt archive)");
  // The end-of-central-directory record: the last one in the final 64 KiB + 22 bytes.
  std::size_t eocd = std::string::npos;
  for (std::size_t k = n - 22 + 1; k-- > 0 && n - k <= 65535 + 22;)
    if (le(b, k, 4) == 0x06054b50 && k + 22 + le(b, k + 20, 2) == n) {
      eocd = k;
      break;
    }
  if (eocd == std::string::npos) detail::damaged(path, "no end of central directory (truncated?)");
  std::uint64_t count = le(b, eocd + 10, 2), cd_size = le(b, eocd + 12, 4), cd_off = le(b, eocd + 16, 4);
  std::size_t cd_end_limit = eocd;
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {  // zip64: a locator just before
    if (eocd < 20 || le(b, eocd - 20, 4) != 0x07064b50) detail::damaged(path, "bad zip64 locator");
    const auto z = le(b, eocd - 20 + 8, 8);
    if (z > eocd - 20 || eocd - 20 - z < 56 || le(b, z, 4) != 0x06064b50) detail::damaged(path, "bad zip64 end of central directory");
    count = le(b, z + 32, 8);
    cd_size = le(b, z + 40, 8);
    cd_off = le(b, z + 48, 8);
    cd_end_limit = std::size_t(z);
  }
  if (cd_off > cd_end_limit || cd_size > cd_end_limit - cd_off) detail::damaged(path, "central directory outside the file");
  if (count == 0 || count > cd_size / 46) detail::damaged(path, std::to_string(count) + " entries cannot fit the central directory");
  std::size_t c = std::size_t(cd_off);
  const std::size_t cd_end = std::size_t(cd_off + cd_size);
  std::unordered_map<std::string_view, std::uint64_t> sizes;  // every record's, by name
  std::vector<std::pair<std::string_view, std::span<const std::uint8_t>>> pickles;
  for (std::uint64_t e = 0; e < count; ++e) {
    if (cd_end - c < 46 || le(b, c, 4) != 0x02014b50) detail::damaged(path, "bad central directory entry " + std::to_string(e));
    const auto method = le(b, c + 10, 2);
    std::uint64_t comp = le(b, c + 20, 4), size = le(b, c + 24, 4), local = le(b, c + 42, 4);
    const auto name_len = le(b, c + 28, 2), extra_len = le(b, c + 30, 2), comment_len = le(b, c + 32, 2);
    if (cd_end - c - 46 < name_len + extra_len + comment_len) detail::damaged(path, "central directory entry " + std::to_string(e) + " overruns");
    const std::string_view name(reinterpret_cast<const char*>(b.data() + c + 46), name_len);
    // zip64 sizes and offset, in this order, for the fields that say 0xFFFFFFFF.
    for (std::size_t x = c + 46 + name_len, x_end = x + extra_len; x + 4 <= x_end;) {
      const auto id = le(b, x, 2), len = le(b, x + 2, 2);
      if (len > x_end - x - 4) detail::damaged(path, std::string(name) + ": bad extra field");
      if (id == 0x0001) {
        std::size_t y = x + 4;
        for (auto* field : {&size, &comp, &local})
          if (*field == 0xFFFFFFFF) {
            if (y + 8 > x + 4 + len) detail::damaged(path, std::string(name) + ": bad zip64 field");
            *field = le(b, y, 8);
            y += 8;
          }
      }
      x += 4 + len;
    }
    // LibTorch stores every record as it is, except TorchScript sources, which it may deflate: a deflated record's
    // declared size is bounded by deflate's largest ratio (1032:1) and by max_source_bytes.
    const bool source = name.find("/code/") != std::string_view::npos || name.starts_with("code/");
    const bool deflated = method == 8 && source && name.ends_with(".py");
    if (!(method == 0 && comp == size) && !(deflated && size <= comp * 1032 && size <= max_source_bytes))
      detail::damaged(path, std::string(name) + ": compression method " + std::to_string(method) + ", " + std::to_string(comp) +
                                " bytes declared as " + std::to_string(size) + " (LibTorch stores its records)");
    if (local > cd_off || cd_off - local < 30 || le(b, std::size_t(local), 4) != 0x04034b50)
      detail::damaged(path, std::string(name) + ": bad local header");
    const auto data = local + 30 + le(b, std::size_t(local) + 26, 2) + le(b, std::size_t(local) + 28, 2);
    if (data > cd_off || comp > cd_off - data)
      detail::damaged(path, std::string(name) + ": record of " + std::to_string(comp) + " bytes outside the file");
    if (!sizes.emplace(name, size).second) detail::damaged(path, "two records named " + std::string(name));
    if (deflated) {
      c += 46 + name_len + extra_len + comment_len;
      continue;
    }
    const auto record = b.subspan(std::size_t(data), std::size_t(size));
    if (name.ends_with("pkl")) pickles.emplace_back(name, record);  // data.pkl, constants.pkl, *.debug_pkl
    if (source) {
      int depth = 0;
      for (const auto ch : record) {
        depth += (ch == '(' || ch == '[' || ch == '{') - (ch == ')' || ch == ']' || ch == '}');
        if (depth > 64) detail::damaged(path, std::string(name) + ": source nested deeper than 64 brackets");
      }
    }
    c += 46 + name_len + extra_len + comment_len;
  }
  const RecordSize record_size = [&](std::string_view name) -> std::optional<std::uint64_t> {
    const auto it = sizes.find(name);
    return it == sizes.end() ? std::nullopt : std::optional(it->second);
  };
  for (const auto& [name, record] : pickles) check_pickle(record, path, name, record_size);
}

//! Runs `f` (which reads the file `path`), turning LibTorch's and the standard library's errors into one
//! `FileError` naming the file; accel's own errors pass through (those about the file already name it).
template <class F>
decltype(auto) reading(const std::string& path, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const FileError&) {
    throw;
  } catch (const c10::Error& e) {
    throw FileError(path, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    throw FileError(path, "not a readable LibTorch archive: it asks for more memory than there is");
  } catch (const std::exception& e) {
    throw FileError(path, e.what());
  }
}

//! Opens the archive `bytes` (the file `path`) into `a`: the one way accel reads a LibTorch archive.
inline void load_archive(torch::serialize::InputArchive& a, std::span<const std::uint8_t> bytes, const std::string& path,
                         std::optional<c10::Device> device = std::nullopt) {
  check_zip(bytes, path);
  reading(path, [&] { a.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size(), device); });
}

//! A tensor read from `path` must have the shape and dtype of the one it restores (`whose`: "the model's"), and be dense:
//! its elements neither overlap nor leave gaps (a forged stride of 0 would make a step write one element twice).
inline void check_layout(const std::string& path, const std::string& what, const at::Tensor& got, const char* whose,
                         const at::Tensor& want) {
  if (got.sizes().equals(want.sizes()) && got.scalar_type() == want.scalar_type()) {
    if (got.is_non_overlapping_and_dense()) return;
    throw FileError(path, "holds " + what + " of strides " + c10::str(got.strides()) + ", whose elements overlap or leave gaps "
                              "(a tensor LibTorch writes is dense)");
  }
  throw FileError(path, "holds " + what + " of shape " + c10::str(got.sizes()) + " and dtype " +
                            std::string(c10::toString(got.scalar_type())) + ", " + whose + " is " + c10::str(want.sizes()) +
                            " " + std::string(c10::toString(want.scalar_type())));
}

//! LibTorch's Module::load replaces a parameter by whatever tensor the archive holds (`set_`), of any shape or
//! dtype: a damaged archive would load into a model of another shape. This checks every parameter and buffer of
//! `m` that the archive `a` (read from `path`) holds, submodules included (each a nested archive, as Module::save
//! writes them), before `m.load(a)`.
inline void check_module(const torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& path,
                         const std::string& prefix = "") {
  auto check = [&](const std::string& key, const at::Tensor& want) {
    at::Tensor got;
    if (!reading(path, [&] { return a.try_read(key, got); })) return;  // Module::load names a missing key itself
    check_layout(path, prefix + key, got, "the model's", want);
  };
  for (const auto& p : m.named_parameters(/*recurse=*/false)) check(p.key(), p.value());
  for (const auto& b : m.named_buffers(/*recurse=*/false)) check(b.key(), b.value());
  for (const auto& child : m.named_children()) {
    torch::serialize::InputArchive sub;
    if (!reading(path, [&] { return a.try_read(child.key(), sub); })) continue;
    check_module(*child.value(), sub, path, prefix + child.key() + ".");
  }
}

}  // namespace accel::checkpoint
