#pragma once
//! \file
//! CRC-32C (Castagnoli): the checksum of checkpoint manifests (checkpoint/manifest.hpp) and of TensorBoard's
//! records (tracking/tensorboard.hpp). Table-driven, slicing by 8: about 3 GB/s on one core.

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace accel {

namespace detail {
// Tables for slicing by 8 (reflected polynomial 0x82F63B78): crc32c_tables[k][b] is the CRC of byte b followed
// by k zero bytes.
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  return t;
}();
}  // namespace detail

//! CRC-32C of `bytes`, continuing from `crc` (the CRC of what came before; 0 to start).
[[nodiscard]] inline std::uint32_t crc32c(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  const auto& t = detail::crc32c_tables;
  std::uint32_t c = ~crc;
  const std::uint8_t* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {  // little-endian word order, as the tables assume
    const std::uint32_t lo =
        c ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^
        t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFF];
  return ~c;
}
//! The CRC-32C of `text`, continuing `crc` (0: a new checksum).
[[nodiscard]] inline std::uint32_t crc32c(std::string_view text, std::uint32_t crc = 0) {
  return crc32c(std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()), crc);
}

}  // namespace accel
