#pragma once
//! \file
//! The safetensors format (checkpoint/safetensors.hpp): its dtypes, a file's header read and checked against the
//! file (`safetensors_detail::read_header`), and a tensor read from it (`safetensors_detail::read_entry`), with
//! `SafetensorsError` and the maps the readers and writers use (`TensorMap`, `Metadata`).
//!
//! The file format (safetensors): an 8-byte little-endian header length N, N bytes of JSON
//! `{"__metadata__": {string: string}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}` padded with
//! spaces to a multiple of 8, then the tensors' bytes, contiguous, in safetensors' order (dtypes of larger
//! alignment first, then by name). `write_safetensors` writes the same bytes as Python's
//! `safetensors.torch.save_file`. Every problem of a file read (truncated, a header length beyond the file, a
//! header that is not JSON, an unknown dtype, a shape whose size is not its span, offsets out of range,
//! overlapping or leaving bytes uncovered) is one `SafetensorsError` naming the file and the problem; sizes are
//! checked against the file's size before anything is allocated.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

namespace accel::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "accel's safetensors reader and writer copy tensor bytes as they are: a little-endian host is needed");

//! A safetensors file that cannot be read or written, or that does not fit the module it is loaded into.
struct SafetensorsError : Error {
  using Error::Error;
};

using TensorMap = std::map<std::string, at::Tensor>;  //!< tensors by name
using Metadata = std::map<std::string, std::string>;  //!< a file's `__metadata__`

namespace safetensors_detail {

struct Dtype {
  const char* name;
  c10::ScalarType type;
  int rank;  // the position in safetensors' Dtype enum: larger first in a file
  std::size_t size;
};
// The dtypes ATen and safetensors share, in safetensors' (Rust) enum order.
inline constexpr Dtype dtypes[] = {{"BOOL", c10::kBool, 0, 1},
                                   {"U8", c10::kByte, 1, 1},
                                   {"I8", c10::kChar, 2, 1},
                                   {"F8_E5M2", c10::kFloat8_e5m2, 3, 1},
                                   {"F8_E4M3", c10::kFloat8_e4m3fn, 4, 1},
                                   {"I16", c10::kShort, 5, 2},
                                   {"U16", c10::kUInt16, 6, 2},
                                   {"F16", c10::kHalf, 7, 2},
                                   {"BF16", c10::kBFloat16, 8, 2},
                                   {"I32", c10::kInt, 9, 4},
                                   {"U32", c10::kUInt32, 10, 4},
                                   {"F32", c10::kFloat, 11, 4},
                                   {"C64", c10::kComplexFloat, 12, 8},
                                   {"F64", c10::kDouble, 13, 8},
                                   {"I64", c10::kLong, 14, 8},
                                   {"U64", c10::kUInt64, 15, 8}};

inline const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : dtypes)
    if (name == d.name) return &d;
  return nullptr;
}
inline const Dtype* dtype_of(c10::ScalarType t) {
  for (const auto& d : dtypes)
    if (t == d.type) return &d;
  return nullptr;
}

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] inline void fail(const std::filesystem::path& path, const std::string& what) {
  throw SafetensorsError("accel: " + path.string() + ": " + what);
}

//! One tensor of a file's header.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // offsets in the data section
};
//! A file's header, checked against the file's size.
struct Header {
  std::vector<Entry> entries;  // in data order
  Metadata metadata;
  std::uint64_t data_start = 0;
};

// safetensors' own limit on the header (MAX_HEADER_SIZE): a larger length is a damaged file, not a big model.
inline constexpr std::uint64_t max_header_size = 100'000'000;

// Note [JSON at the call site]: every function that touches nlohmann-json is a template whose JSON types depend
// on its (defaulted, never named) template parameter, so that only a translation unit that calls one of them
// compiles nlohmann's parser and writer. As inline functions they cost every translation unit that includes this
// header about 2 s of g++'s time (benchmarks/README.md, "Compile time"). The parameter is never given. Their
// definitions, and nlohmann's header, are in the impl/*.ipp files of this folder (safetensors_format.ipp: `Json`,
// `read_header`; safetensors_file.ipp; safetensors.ipp): under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp)
// only their declarations are seen, and <accel/src.hpp> instantiates them once, for `void`.
inline at::Tensor read_entry(const std::filesystem::path& path, std::ifstream& in, const Header& h, const Entry& e) {
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
  const auto n = std::streamsize(e.end - e.begin);
  if (n == 0) return t;
  in.seekg(std::streamoff(h.data_start + e.begin));
  in.read(static_cast<char*>(t.data_ptr()), n);
  if (in.gcount() != n) fail(path, "truncated while reading tensor '" + e.name + "' (the file changed?)");
  return t;
}

}  // namespace safetensors_detail

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/safetensors_format.ipp>
#endif
