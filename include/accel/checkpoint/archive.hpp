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
ACCEL_DECL void check_zip(std::span<const std::uint8_t> b, const std::string& path);

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
inline void load_archive(torch::serialize::InputArchive& a, std::span<const std::uint8_t> bytes,
                         const std::string& path, std::optional<c10::Device> device = std::nullopt) {
  check_zip(bytes, path);
  reading(path, [&] { a.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size(), device); });
}

//! A tensor read from `path` must have the shape and dtype of the one it restores (`whose`: "the model's"), and be
//! dense: its elements neither overlap nor leave gaps (a forged stride of 0 would make a step write one element twice).
ACCEL_DECL void check_layout(const std::string& path, const std::string& what, const at::Tensor& got, const char* whose,
                             const at::Tensor& want);

//! LibTorch's Module::load replaces a parameter by whatever tensor the archive holds (`set_`), of any shape or
//! dtype: a damaged archive would load into a model of another shape. This checks every parameter and buffer of
//! `m` that the archive `a` (read from `path`) holds, submodules included (each a nested archive, as Module::save
//! writes them), before `m.load(a)`.
ACCEL_DECL void check_module(const torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& path,
                             const std::string& prefix = "");

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/archive.ipp>
#endif
