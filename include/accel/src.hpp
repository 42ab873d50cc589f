#pragma once
//! \file
//! accel's non-template code, compiled once: include this header in exactly one `.cpp` of a program built with
//! `ACCEL_SEPARATE_COMPILATION` (detail/linkage.hpp, Note [Separate compilation]), before any other accel header.
//! CMake: `accel_add_separate_library(name)` makes a static library of this file that also gives
//! ACCEL_SEPARATE_COMPILATION to every target linking it.
//!
//! \code
//! // accel.cpp, the program's one file for accel (compiled, like every other file, with ACCEL_SEPARATE_COMPILATION)
//! #include <accel/src.hpp>
//! \endcode

#if defined(ACCEL_DECL)
#error \
    "accel: <accel/src.hpp> must come before any other accel header of its translation unit (it compiles their definitions)"
#else
#define ACCEL_SOURCE 1

#include <accel/accel.hpp>

// The JSON function templates (checkpoint/safetensors_format.hpp, Note [JSON at the call site]), instantiated for
// the one argument they are ever called with.
namespace accel::checkpoint {
template TensorMap read_safetensors<void>(const std::filesystem::path&);
template Metadata read_safetensors_metadata<void>(const std::filesystem::path&);
template void write_safetensors<void>(const std::filesystem::path&, const TensorMap&, const Metadata&);
template ShardPlan save_model<void>(const torch::nn::Module&, const std::filesystem::path&, const SaveModelOptions&);
template void load_model<void>(torch::nn::Module&, const std::filesystem::path&, const LoadModelOptions&);
template ShardPlan save_safetensors_sharded<void>(const NamedTensors&, const std::filesystem::path&,
                                                  const SaveShardedOptions&);
template ShardPlan save_safetensors_sharded<void>(const TensorMap&, const std::filesystem::path&,
                                                  const SaveShardedOptions&);
template TensorMap load_safetensors_sharded<void>(const std::filesystem::path&, const std::string&);
}  // namespace accel::checkpoint

#endif
