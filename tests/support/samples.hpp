#pragma once
// Index data the loader tests share, unit and multi-process: 0..n-1, a tensor's values, and a user batch sampler
// of uneven batches.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace accel_test {

//! Batches of sample ids, as the loader tests compare them.
using Batches = std::vector<std::vector<std::int64_t>>;

//! 0, 1, ..., n-1.
inline std::vector<std::int64_t> iota_vector(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

//! An int64 tensor's values.
inline std::vector<std::int64_t> as_vector(const at::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

//! A user batch sampler: batches of 1 to 4 samples over a permutation of 31 samples that changes with the epoch.
inline std::vector<std::vector<std::int64_t>> bucketed_batches(std::int64_t epoch) {
  auto perm = iota_vector(31);
  std::mt19937_64 g(std::uint64_t(epoch) + 3);
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < perm.size();) {
    const std::size_t len = std::min<std::size_t>(1 + g() % 4, perm.size() - i);
    out.emplace_back(perm.begin() + std::ptrdiff_t(i), perm.begin() + std::ptrdiff_t(i + len));
    i += len;
  }
  return out;
}

}  // namespace accel_test
