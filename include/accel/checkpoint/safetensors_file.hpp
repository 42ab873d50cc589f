#pragma once
//! \file
//! safetensors files read and written (checkpoint/safetensors.hpp): every tensor of a file (`read_safetensors`),
//! its metadata (`read_safetensors_metadata`), and tensors written as one file (`write_safetensors`), in the
//! format of checkpoint/safetensors_format.hpp, whose Note [JSON at the call site] makes them templates.

#include <accel/checkpoint/safetensors_format.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace accel::checkpoint {

// The public functions below are templates for Note [JSON at the call site]; they are called as functions.

//! Every tensor of a safetensors file, by name, on the CPU.
template <class Deferred = void>
TensorMap read_safetensors(const std::filesystem::path& path);

//! The `__metadata__` of a safetensors file (empty when it has none).
template <class Deferred = void>
Metadata read_safetensors_metadata(const std::filesystem::path& path);

//! Writes `tensors` (any device, any layout: they are copied to contiguous CPU memory) as one safetensors file,
//! byte for byte what `safetensors.torch.save_file(tensors, path, metadata)` writes. An empty `metadata` writes
//! no `__metadata__`.
template <class Deferred = void>
void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                       const Metadata& metadata = {{"format", "pt"}});

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/safetensors_file.ipp>
#endif
