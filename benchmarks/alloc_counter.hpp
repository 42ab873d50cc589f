#pragma once
// Counts heap allocations of the whole process (a benchmark binary replaces the global operator new with
// this, so "bytes allocated per batch" is measured, not estimated). Include in exactly one TU per binary.
//
// Tensor storage does not go through operator new (LibTorch's CPU allocator calls posix_memalign), so a binary
// that wants tensor bytes too calls `accel_bench::count_tensor_bytes()` once, before it builds tensors: from then
// on every CPU tensor allocation of the process (any thread) goes through `TensorCounter`, which keeps the bytes
// live now and the peak since `reset_tensor_peak()`.
#include "tensor_counter.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace accel_bench {
inline std::atomic<std::size_t> allocated_bytes{0};
inline std::atomic<std::size_t> allocations{0};
}  // namespace accel_bench

void* operator new(std::size_t size) {
  accel_bench::allocated_bytes.fetch_add(size, std::memory_order_relaxed);
  accel_bench::allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
