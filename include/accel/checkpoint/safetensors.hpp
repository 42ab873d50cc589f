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
//! accel::checkpoint::save_safetensors_sharded(tensors, "maps", {.max_shard_size = 1'000'000});  // no module
//! auto all = accel::checkpoint::load_safetensors_sharded("maps");                  // every shard, one map
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
//! The verbs: `read_`/`write_` take one file (checkpoint/safetensors_file.hpp), `save_`/`load_` a checkpoint
//! directory. `save_safetensors_sharded` and `load_safetensors_sharded` are `save_model` and `load_model` without a
//! module: a map of names to tensors saved by the same code (the same split, file names, index and removal of a
//! previous save's files; tensors sharing storage kept once, under the first name in the map's order), and a whole
//! directory read back into one map, with the checks of `load_model`.
//!
//! Every reader of a directory checks, before it reads a tensor: the index is at most `max_index_size` bytes of
//! JSON with a non-empty `weight_map` of file names inside the index's directory (a name with `/`, `\\` or `..`
//! is refused); every file is a safetensors file (checkpoint/safetensors_format.hpp); every tensor the index names
//! is in the file it names, no file holds a tensor the index does not name, and no name is in two files.
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
//! The largest index a reader parses: an index names each tensor once (about 100 bytes each), so 100 MB is a
//! million tensors; a larger file is damaged or not an index.
inline constexpr std::uintmax_t max_index_size = 100'000'000;

//! Tensors by name in an order of their own (a `state_dict`'s), which decides the split into shards; a
//! `TensorMap` is in name order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

//! huggingface_hub's `parse_size_to_int`: "5GB", "500KB", "1.5MB" (decimal units: KB = 1000 bytes).
ACCEL_DECL std::int64_t parse_size(const std::string& text);

// ---- models ---------------------------------------------------------------------------------------------------

//! A module's tensors by PyTorch's `state_dict` names, in its order, tensors sharing storage kept once (under
//! the first name), as Accelerate's `get_state_dict` + `clean_state_dict_for_safetensors` give them.
ACCEL_DECL NamedTensors model_state(const torch::nn::Module& model);

//! `tensors` less each tensor whose storage an earlier one shares (Accelerate's
//! `clean_state_dict_for_safetensors`: the first name is kept). A storage of no bytes is shared by none.
ACCEL_DECL NamedTensors unique_storages(const NamedTensors& tensors);

//! How `save_model` splits a state into files (huggingface_hub's `StateDictSplit`).
struct ShardPlan {
  std::vector<std::pair<std::string, std::vector<std::string>>> files;  //!< file name -> tensor names, in order
  std::int64_t total_size = 0;                                          //!< bytes of every tensor's storage
  //! Whether the state needs several files.
  [[nodiscard]] bool sharded() const noexcept { return files.size() > 1; }
};

// [huggingface_hub:serialization/_base.py split_state_dict_into_shards_factory]
//! The files of `state` under `max_shard_size` bytes per file, named `<stem><suffix><extension>`.
ACCEL_DECL ShardPlan plan_shards(const NamedTensors& state, std::int64_t max_shard_size,
                                 const std::string& stem = "model", const std::string& extension = ".safetensors");

//! `save_model`'s and `save_safetensors_sharded`'s settings (Accelerate's `max_shard_size`; `safe_serialization`
//! is always true here).
struct SaveModelOptions {
  std::int64_t max_shard_size = default_max_shard_size;  //!< bytes per file (see `parse_size`)
  Metadata metadata{{"format", "pt"}};                   //!< each file's `__metadata__`, as Accelerate writes it
  //! `<stem>.safetensors`: the single file; shards are `<stem>-00001-of-0000N.safetensors`, the index
  //! `<stem>.safetensors.index.json` (huggingface_hub's `filename_pattern` "<stem>{suffix}.safetensors").
  std::string weights_name = safe_weights_name;
};
//! `save_safetensors_sharded`'s settings: the same as `save_model`'s (one split rule, one naming rule).
using SaveShardedOptions = SaveModelOptions;

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
  std::string weights_name = safe_weights_name;  //!< what a directory holds: `<stem>.safetensors[.index.json]`
};

// [accelerate:utils/modeling.py load_checkpoint_in_model]
//! Fills `model`'s parameters and buffers by name from `path`: a directory holding `model.safetensors.index.json`
//! (a sharded checkpoint) or `model.safetensors`, an index file, or one safetensors file.
template <class Deferred = void>
void load_model(torch::nn::Module& model, const std::filesystem::path& path, const LoadModelOptions& options = {});

// ---- maps -----------------------------------------------------------------------------------------------------

// [huggingface_hub:serialization/_torch.py save_torch_state_dict]
//! Writes `tensors` into `dir` (created if needed) as `save_model` writes a module's: `<stem>.safetensors`, or
//! shards and their index above `max_shard_size`, split in the order of `tensors`; a tensor sharing storage with
//! an earlier one is left out (`unique_storages`). Byte for byte what Accelerate's `save_model` writes for the same
//! `state_dict`. Refuses an empty map. Returns the plan it wrote.
template <class Deferred = void>
ShardPlan save_safetensors_sharded(const NamedTensors& tensors, const std::filesystem::path& dir,
                                   const SaveShardedOptions& options = {});
//! The same, in name order (a Python `dict` of the same tensors sorted by name writes the same files).
template <class Deferred = void>
ShardPlan save_safetensors_sharded(const TensorMap& tensors, const std::filesystem::path& dir,
                                   const SaveShardedOptions& options = {});

// [transformers:modeling_utils.py load_sharded_checkpoint]
//! Every tensor of a checkpoint, by name, on the CPU: `path` is a directory holding `<stem>.safetensors.index.json`
//! and its shards or `<stem>.safetensors` (`weights_name`), an index file (`*.index.json`), or one safetensors
//! file. Every file is checked before the first tensor is read (see the top of this header); a failure throws one
//! `SafetensorsError` naming the file, and returns nothing.
template <class Deferred = void>
TensorMap load_safetensors_sharded(const std::filesystem::path& path,
                                   const std::string& weights_name = safe_weights_name);

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/safetensors.ipp>
#endif
