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

#if ACCEL_DEFINITIONS  // Note [JSON at the call site]
#include <nlohmann/json.hpp>
#endif

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

using TensorMap = std::map<std::string, at::Tensor>;
using Metadata = std::map<std::string, std::string>;

namespace safetensors_detail {

struct Dtype {
  const char* name;
  c10::ScalarType type;
  int rank;  // the position in safetensors' Dtype enum: larger first in a file
  std::size_t size;
};
// The dtypes ATen and safetensors share, in safetensors' (Rust) enum order.
inline constexpr Dtype dtypes[] = {
    {"BOOL", c10::kBool, 0, 1},           {"U8", c10::kByte, 1, 1},          {"I8", c10::kChar, 2, 1},
    {"F8_E5M2", c10::kFloat8_e5m2, 3, 1}, {"F8_E4M3", c10::kFloat8_e4m3fn, 4, 1}, {"I16", c10::kShort, 5, 2},
    {"U16", c10::kUInt16, 6, 2},          {"F16", c10::kHalf, 7, 2},         {"BF16", c10::kBFloat16, 8, 2},
    {"I32", c10::kInt, 9, 4},             {"U32", c10::kUInt32, 10, 4},      {"F32", c10::kFloat, 11, 4},
    {"C64", c10::kComplexFloat, 12, 8},   {"F64", c10::kDouble, 13, 8},      {"I64", c10::kLong, 14, 8},
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
// header about 2 s of g++'s time (benchmarks/README.md, "Compile time"). The parameter is never given. Under
// ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp) only their declarations are seen, not even nlohmann's header:
// <accel/src.hpp> instantiates them once, for `void`.
#if ACCEL_DEFINITIONS
template <class>
struct Json {
  using type = nlohmann::json;
  using ordered = nlohmann::ordered_json;
};

template <class Deferred = void>
Header read_header(const std::filesystem::path& path, std::ifstream& in) {
  using json = typename Json<Deferred>::type;
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot be read (" + ec.message() + ")");
  in.open(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened for reading");
  if (file_size < 8)
    fail(path, "truncated: " + std::to_string(file_size) + " bytes, fewer than the 8 bytes of the header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > file_size - 8)
    fail(path, "the header length is " + std::to_string(n) + " bytes but only " + std::to_string(file_size - 8) +
                   " bytes follow it (a truncated file, or not a safetensors file)");
  if (n > max_header_size)
    fail(path, "the header length is " + std::to_string(n) + " bytes, over safetensors' limit of " +
                   std::to_string(max_header_size));
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  if (std::uint64_t(in.gcount()) != n) fail(path, "truncated while reading the header");
  if (text.empty() || text.front() != '{') fail(path, "the header does not start with '{' (not a safetensors file)");
  json j;
  try {
    j = json::parse(text);
  } catch (const typename json::parse_error& e) {
    fail(path, std::string("the header is not JSON: ") + e.what());
  }
  if (!j.is_object()) fail(path, "the header is not a JSON object");

  Header h;
  h.data_start = 8 + n;
  const std::uint64_t data_size = file_size - 8 - n;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(path, "__metadata__[\"" + k + "\"] is not a string");
        h.metadata[k] = s.template get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail(path, where + ": expected an object with dtype, shape and data_offsets");
    Entry e{name};
    if (!v["dtype"].is_string()) fail(path, where + ": dtype is not a string");
    e.dtype = dtype_named(v["dtype"].template get<std::string>());
    if (!e.dtype) fail(path, where + ": unknown dtype '" + v["dtype"].template get<std::string>() + "'");
    if (!v["shape"].is_array()) fail(path, where + ": shape is not an array");
    // The tensor's byte count; a count past 64 bits is a damaged header, not a tensor.
    std::uint64_t bytes = e.dtype->size;
    bool too_big = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(path, where + ": shape holds " + d.dump() + ", not a non-negative integer");
      const std::uint64_t x = d.template get<std::uint64_t>();
      if (x > std::uint64_t(INT64_MAX)) fail(path, where + ": dimension " + d.dump() + " is out of range");
      e.shape.push_back(std::int64_t(x));
      if (x != 0 && bytes > UINT64_MAX / x) too_big = true;
      else bytes *= x;
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, where + ": data_offsets is not a pair of non-negative integers");
    e.begin = off[0].template get<std::uint64_t>();
    e.end = off[1].template get<std::uint64_t>();
    const std::string span = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.begin > e.end) fail(path, where + ": data_offsets " + span + " end before they begin");
    if (e.end > data_size)
      fail(path, where + ": data_offsets " + span + " are out of range: the data section has " +
                     std::to_string(data_size) + " bytes (a truncated file?)");
    if (std::any_of(e.shape.begin(), e.shape.end(), [](std::int64_t x) { return x == 0; })) bytes = 0, too_big = false;
    if (too_big || bytes != e.end - e.begin)
      fail(path, where + ": shape " + shape_text(e.shape) + " of " + e.dtype->name + " needs " +
                     (too_big ? std::string("more than 2^64 bytes") : std::to_string(bytes) + " bytes") +
                     " but data_offsets " + span + " span " + std::to_string(e.end - e.begin));
    h.entries.push_back(std::move(e));
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  // The tensors tile the data section: each starts where the previous ended, the last ends at the file's end.
  std::uint64_t at = 0;
  const Entry* previous = nullptr;
  for (const auto& e : h.entries) {
    if (e.begin < at)
      fail(path, "tensor '" + e.name + "' (bytes " + std::to_string(e.begin) + " to " + std::to_string(e.end) +
                     ") overlaps tensor '" + previous->name + "' (which ends at " + std::to_string(at) + ")");
    if (e.begin > at)
      fail(path, "bytes " + std::to_string(at) + " to " + std::to_string(e.begin) +
                     " of the data section belong to no tensor");
    at = e.end;
    previous = &e;
  }
  if (at != data_size)
    fail(path, "the data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
                   std::to_string(at) + " (bytes " + std::to_string(at) + " to " + std::to_string(data_size) +
                   " belong to no tensor)");
  return h;
}
#endif  // ACCEL_DEFINITIONS

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
