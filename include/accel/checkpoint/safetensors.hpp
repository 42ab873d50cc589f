#pragma once
//! \file
//! Model interchange with the Hugging Face ecosystem: safetensors files, read and written in C++, and the
//! sharded checkpoint directory that Accelerate's `Accelerator.save_model` writes.
//!
//! \code
//! accel::checkpoint::write_safetensors("w.safetensors", {{"w", w}, {"b", b}});   // metadata {"format": "pt"}
//! auto tensors = accel::checkpoint::read_safetensors("w.safetensors");           // name -> CPU tensor
//! accel::checkpoint::save_model(*net, "out", {.max_shard_size = accel::checkpoint::parse_size("5GB")});
//! accel::checkpoint::load_model(*net, "out");        // a directory (index or single file) or one file
//! \endcode
//! `Accelerator::save_model` is `save_model` on the main process of a job (the others wait).
//!
//! The format and the reading of a file's header are checkpoint/safetensors_format.hpp; files read and written,
//! checkpoint/safetensors_file.hpp. This header holds the models' save and load and includes both.
//!
//! A model's names are PyTorch's `state_dict` names, in its order: each module's parameters, then its buffers,
//! then its children's (LibTorch has no non-persistent buffers: every buffer is saved). Tensors sharing storage
//! (tied weights) are saved once, under the first name, as Accelerate's `clean_state_dict_for_safetensors` does;
//! loading fills the others through the shared storage.
//!
//! Sharding follows huggingface_hub's `split_torch_state_dict_into_shards`: tensors in state_dict order, a new
//! shard when the next tensor would take the current one over `max_shard_size` (bytes of the tensor's storage),
//! a tensor larger than `max_shard_size` alone in a shard of its own (placed at the time it is met, before the
//! shard being filled); one shard is `model.safetensors`, several are `model-00001-of-0000N.safetensors` with
//! `model.safetensors.index.json` = `{"metadata": {"total_size": bytes}, "weight_map": {name: file}}` (keys
//! sorted, indent 2, as Accelerate writes it). Unlike Accelerate, `save_model` also removes what a previous save
//! left in the directory that this one does not replace (old shards, an old index or single file), so that a
//! loader never mixes two saves.
//!
//! `load_model` fills a module by name from files written by Python (`save_file`, Accelerate's `save_model`,
//! sharded or not) or by `save_model`: every check (each file's header; every name of the module present, with
//! its shape and dtype; with `strict`, no name in the files that the module lacks) runs before the first tensor
//! is copied, so a failed load leaves the module as it was; then one shard at a time is read. A dtype mismatch is
//! an error unless `allow_cast`.

#include <accel/checkpoint/safetensors_file.hpp>
#include <accel/checkpoint/safetensors_format.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel::checkpoint {

//! Accelerate's default `max_shard_size`, "10GB".
inline constexpr std::int64_t default_max_shard_size = 10'000'000'000;
inline constexpr const char* safe_weights_name = "model.safetensors";  //!< `save_model`'s file when unsharded
//! The index of a sharded save.
inline constexpr const char* safe_weights_index_name = "model.safetensors.index.json";

//! huggingface_hub's `parse_size_to_int`: "5GB", "500KB", "1.5MB" (decimal units: KB = 1000 bytes).
ACCEL_DECL std::int64_t parse_size(const std::string& text);

// ---- models ---------------------------------------------------------------------------------------------------

//! A module's tensors by PyTorch's `state_dict` names, in its order, tensors sharing storage kept once (under
//! the first name), as Accelerate's `get_state_dict` + `clean_state_dict_for_safetensors` give them.
ACCEL_DECL std::vector<std::pair<std::string, at::Tensor>> model_state(const torch::nn::Module& model);

//! How `save_model` splits a state into files (huggingface_hub's `StateDictSplit`).
struct ShardPlan {
  std::vector<std::pair<std::string, std::vector<std::string>>> files;  //!< file name -> tensor names, in order
  std::int64_t total_size = 0;                                          //!< bytes of every tensor's storage
  //! Whether the state needs several files.
  [[nodiscard]] bool sharded() const noexcept { return files.size() > 1; }
};

// [huggingface_hub:serialization/_base.py split_state_dict_into_shards_factory]
//! The files of `state` under `max_shard_size` bytes per file, named `<stem><suffix><extension>`.
ACCEL_DECL ShardPlan plan_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                 std::int64_t max_shard_size, const std::string& stem = "model",
                                 const std::string& extension = ".safetensors");

//! `save_model`'s settings (Accelerate's `max_shard_size`; `safe_serialization` is always true here).
struct SaveModelOptions {
  std::int64_t max_shard_size = default_max_shard_size;  //!< bytes per file (see `parse_size`)
  Metadata metadata{{"format", "pt"}};                   //!< each file's `__metadata__`, as Accelerate writes it
};

// [accelerate:accelerator.py Accelerator.save_model]
//! Writes `model`'s parameters and buffers into `dir` (created if needed): `model.safetensors`, or shards and
//! their index above `max_shard_size`. Returns the plan it wrote.
template <class Deferred = void>
ShardPlan save_model(const torch::nn::Module& model, const std::filesystem::path& dir,
                     const SaveModelOptions& options = {});

//! `load_model`'s settings.
struct LoadModelOptions {
  bool strict = true;       //!< a tensor in the files that the module lacks is an error (else it is ignored)
  bool allow_cast = false;  //!< a tensor of another dtype than the module's is converted (else an error)
};

// [accelerate:utils/modeling.py load_checkpoint_in_model]
//! Fills `model`'s parameters and buffers by name from `path`: a directory holding `model.safetensors.index.json`
//! (a sharded checkpoint) or `model.safetensors`, an index file, or one safetensors file.
template <class Deferred = void>
void load_model(torch::nn::Module& model, const std::filesystem::path& path, const LoadModelOptions& options = {});

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/safetensors.ipp>
#endif
