#pragma once
//! \file
//! A generator's state as bytes and back: what checkpoints store for the global and device generators and what a
//! loader records of its sampling generator at the start of an epoch.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace accel {

//! The generator's state as bytes (what `get_state()` returns), for checkpoints and broadcasts.
[[nodiscard]] inline std::vector<std::uint8_t> generator_bytes(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  const at::Tensor s = g.get_state();
  return {s.data_ptr<std::uint8_t>(), s.data_ptr<std::uint8_t>() + s.numel()};
}

//! Restores a state `generator_bytes` returned (a state of another size or kind is an error).
inline void set_generator_bytes(at::Generator g, const std::vector<std::uint8_t>& bytes) {
  at::Tensor s = at::empty({std::int64_t(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), s.data_ptr<std::uint8_t>());
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}

//! What is wrong with `b` as the state of LibTorch's CPU generator, "" if nothing. The state is
//! `CPUGeneratorImplState` (5056 bytes): the mt19937 engine's seed, `left`, `seeded`, `next` and 624 words, then the
//! cached normal samples and their flags. LibTorch's `set_state` accepts any `next` up to 624 with any `left`, but
//! the engine reads word `next` before it counts `left` down to a refill: after seeding `left` is 1 and `next` 0,
//! afterwards `left + next` is 625. Another pair reads past the words (and flags other than 0 or 1 are not bools).
//! A state of another size is for the caller to compare with this LibTorch's.
inline std::string cpu_generator_state_problem(std::span<const std::uint8_t> b) {
  if (b.size() != 5056) return {};
  auto i32 = [&](std::size_t at) {
    std::int32_t v;
    std::memcpy(&v, b.data() + at, sizeof v);
    return v;
  };
  std::uint64_t next;
  std::memcpy(&next, b.data() + 16, sizeof next);
  const std::int64_t left = i32(8);
  if (i32(12) != 1) return "a generator state that was never seeded";
  if (!(left == 1 && next == 0) && !(left >= 1 && left <= 624 && next == std::uint64_t(625 - left)))
    return "a generator state whose mt19937 position (left " + std::to_string(left) + ", next " + std::to_string(next) +
           ") no generator reaches";
  if ((i32(5040) != 0 && i32(5040) != 1) || b[5052] > 1) return "a generator state with a damaged normal-sample flag";
  return {};
}

}  // namespace accel
