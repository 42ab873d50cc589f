#pragma once
//! \file
//! The definitions of checkpoint/safetensors_file.hpp's templates, included at its end: they use nlohmann-json (Note
//! [JSON at the call site] in checkpoint/safetensors_format.hpp), whose header stays out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/checkpoint/safetensors_file.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace accel::checkpoint {

template <class Deferred>
TensorMap read_safetensors(const std::filesystem::path& path) {
  std::ifstream in;
  const auto h = safetensors_detail::read_header<Deferred>(path, in);
  TensorMap out;
  for (const auto& e : h.entries) out.emplace(e.name, safetensors_detail::read_entry(path, in, h, e));
  return out;
}

template <class Deferred>
Metadata read_safetensors_metadata(const std::filesystem::path& path) {
  std::ifstream in;
  return safetensors_detail::read_header<Deferred>(path, in).metadata;
}

template <class Deferred>
void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata) {
  using ordered_json = typename safetensors_detail::Json<Deferred>::ordered;
  struct Item {
    const std::string* name;
    const safetensors_detail::Dtype* dtype;
    at::Tensor data;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      safetensors_detail::fail(path, "tensor '" + name + "' is undefined; safetensors stores only tensors with data");
    const auto* d = safetensors_detail::dtype_of(t.scalar_type());
    if (!d)
      safetensors_detail::fail(path, "tensor '" + name + "' has dtype " + std::string(c10::toString(t.scalar_type())) +
                                         ", which safetensors cannot store");
    items.push_back({&name, d, t.to(at::kCPU).contiguous()});
  }
  // safetensors' order: larger alignment first, then by name (bytes compared as unsigned, as Rust's String).
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.dtype->rank != b.dtype->rank ? a.dtype->rank > b.dtype->rank : *a.name < *b.name;
  });
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& it : items) {
    const std::uint64_t n = it.data.nbytes();
    header[*it.name] = {
        {"dtype", it.dtype->name}, {"shape", it.data.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) safetensors_detail::fail(path, "cannot be opened for writing");
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& it : items)
    out.write(static_cast<const char*>(it.data.data_ptr()), std::streamsize(it.data.nbytes()));
  out.close();
  if (!out) safetensors_detail::fail(path, "could not be written completely (disk full?)");
}

}  // namespace accel::checkpoint
