#pragma once
//! \file
//! The JSON half of checkpoint/safetensors_format.hpp, included at its end: `Json` and a file's header read and checked
//! (`read_header`), templates for Note [JSON at the call site]; nlohmann-json's header stays out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/checkpoint/safetensors_format.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace accel::checkpoint {

namespace safetensors_detail {

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
      if (x != 0 && bytes > UINT64_MAX / x)
        too_big = true;
      else
        bytes *= x;
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

}  // namespace safetensors_detail

}  // namespace accel::checkpoint
