#pragma once
// Counts the bytes of every CPU tensor allocation of the process (any thread): `accel_bench::count_tensor_bytes()`
// routes LibTorch's CPU allocator through `TensorCounter`, which keeps the bytes live now and the peak since
// `reset_peak()`. alloc_counter.hpp includes it; tensor_counter_module.cpp exports it to Python (python_fsdp.py), so
// both sides of a comparison count tensor bytes the same way.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace accel_bench {
//! LibTorch's CPU allocation (c10::alloc_cpu: aligned, huge pages where LibTorch uses them), counted. A block
//! counts malloc_usable_size bytes (what the heap really gave), the same on allocation and release.
class TensorCounter final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    void* p = c10::alloc_cpu(n);
    if (p) add(std::int64_t(malloc_usable_size(p)));
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  //! Bytes of tensor storage alive now, and the most alive at once since the last `reset_peak`.
  static std::int64_t live() { return live_.load(std::memory_order_relaxed); }
  static std::int64_t peak() { return peak_.load(std::memory_order_relaxed); }
  static void reset_peak() { peak_.store(live(), std::memory_order_relaxed); }

 private:
  static void add(std::int64_t n) {
    const std::int64_t now = live_.fetch_add(n, std::memory_order_relaxed) + n;
    std::int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  static void release(void* p) {
    if (!p) return;
    live_.fetch_sub(std::int64_t(malloc_usable_size(p)), std::memory_order_relaxed);
    c10::free_cpu(p);
  }
  static inline std::atomic<std::int64_t> live_{0}, peak_{0};
};

//! Routes every later CPU tensor allocation of the process through `TensorCounter` (once, before tensors are built;
//! tensors allocated before keep their own deleter and are not counted).
inline void count_tensor_bytes() {
  // Never destroyed: LibTorch keeps calling the allocator it was given until the process has ended (tensors made
  // while static objects are destroyed), and a destroyed one crashes the exit.
  static auto* counter = new TensorCounter;
  c10::SetCPUAllocator(counter, /*priority=*/std::numeric_limits<std::uint8_t>::max());
}
}  // namespace accel_bench
