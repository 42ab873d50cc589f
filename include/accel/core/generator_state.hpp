#pragma once
//! \file
//! A generator's state as bytes and back: what checkpoints store for the global and device generators and what a
//! loader records of its sampling generator at the start of an epoch.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

namespace accel {

[[nodiscard]] inline std::vector<std::uint8_t> generator_bytes(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  const at::Tensor s = g.get_state();
  return {s.data_ptr<std::uint8_t>(), s.data_ptr<std::uint8_t>() + s.numel()};
}

inline void set_generator_bytes(at::Generator g, const std::vector<std::uint8_t>& bytes) {
  at::Tensor s = at::empty({std::int64_t(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), s.data_ptr<std::uint8_t>());
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}

}  // namespace accel
