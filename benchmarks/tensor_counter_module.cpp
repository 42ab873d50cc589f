// tensor_counter.hpp for a Python process (benchmarks/python_fsdp.py loads it with ctypes): the same count of CPU
// tensor bytes as the C++ benchmarks', so both sides of a comparison measure memory one way. Python's torch and
// this module share the wheel's libc10, so setting the allocator here sets it for the interpreter's tensors.
#include "tensor_counter.hpp"

extern "C" {
//! From now on, every CPU tensor allocation of the process is counted.
void accel_bench_count_tensor_bytes() { accel_bench::count_tensor_bytes(); }
//! Bytes of tensor storage alive now (allocated since the call above).
long long accel_bench_tensor_live() { return accel_bench::TensorCounter::live(); }
//! The most alive at once since the last reset.
long long accel_bench_tensor_peak() { return accel_bench::TensorCounter::peak(); }
//! Starts a new peak from what is alive now.
void accel_bench_tensor_reset_peak() { accel_bench::TensorCounter::reset_peak(); }
}
