#pragma once
//! \file
//! The definitions of `check_zip`, `check_layout` and `check_module` (checkpoint/archive.hpp, included at its end),
//! kept out of user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for their
//! cost: 8 MB of g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/checkpoint/archive.hpp>

namespace accel::checkpoint {

ACCEL_DECL void check_zip(std::span<const std::uint8_t> b, const std::string& path) {
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
    if (z > eocd - 20 || eocd - 20 - z < 56 || le(b, z, 4) != 0x06064b50)
      detail::damaged(path, "bad zip64 end of central directory");
    count = le(b, z + 32, 8);
    cd_size = le(b, z + 40, 8);
    cd_off = le(b, z + 48, 8);
    cd_end_limit = std::size_t(z);
  }
  if (cd_off > cd_end_limit || cd_size > cd_end_limit - cd_off)
    detail::damaged(path, "central directory outside the file");
  if (count == 0 || count > cd_size / 46)
    detail::damaged(path, std::to_string(count) + " entries cannot fit the central directory");
  std::size_t c = std::size_t(cd_off);
  const std::size_t cd_end = std::size_t(cd_off + cd_size);
  std::unordered_map<std::string_view, std::uint64_t> sizes;  // every record's, by name
  std::vector<std::pair<std::string_view, std::span<const std::uint8_t>>> pickles;
  for (std::uint64_t e = 0; e < count; ++e) {
    if (cd_end - c < 46 || le(b, c, 4) != 0x02014b50)
      detail::damaged(path, "bad central directory entry " + std::to_string(e));
    const auto method = le(b, c + 10, 2);
    std::uint64_t comp = le(b, c + 20, 4), size = le(b, c + 24, 4), local = le(b, c + 42, 4);
    const auto name_len = le(b, c + 28, 2), extra_len = le(b, c + 30, 2), comment_len = le(b, c + 32, 2);
    if (cd_end - c - 46 < name_len + extra_len + comment_len)
      detail::damaged(path, "central directory entry " + std::to_string(e) + " overruns");
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
      detail::damaged(path, std::string(name) + ": compression method " + std::to_string(method) + ", " +
                                std::to_string(comp) + " bytes declared as " + std::to_string(size) +
                                " (LibTorch stores its records)");
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

ACCEL_DECL void check_layout(const std::string& path, const std::string& what, const at::Tensor& got, const char* whose,
                             const at::Tensor& want) {
  if (got.sizes().equals(want.sizes()) && got.scalar_type() == want.scalar_type()) {
    if (got.is_non_overlapping_and_dense()) return;
    throw FileError(path, "holds " + what + " of strides " + c10::str(got.strides()) +
                              ", whose elements overlap or leave gaps "
                              "(a tensor LibTorch writes is dense)");
  }
  throw FileError(path, "holds " + what + " of shape " + c10::str(got.sizes()) + " and dtype " +
                            std::string(c10::toString(got.scalar_type())) + ", " + whose + " is " +
                            c10::str(want.sizes()) + " " + std::string(c10::toString(want.scalar_type())));
}

ACCEL_DECL void check_module(const torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& path,
                             const std::string& prefix) {
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
