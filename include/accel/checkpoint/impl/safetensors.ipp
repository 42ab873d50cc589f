#pragma once
//! \file
//! The definitions of checkpoint/safetensors.hpp's `save_model` and `load_model`, included at its end: they use
//! nlohmann-json (the index file; Note [JSON at the call site] in checkpoint/safetensors_format.hpp), whose header
//! stays out of user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/checkpoint/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace accel::checkpoint {

template <class Deferred>
ShardPlan save_model(const torch::nn::Module& model, const std::filesystem::path& dir, const SaveModelOptions& options) {
  using json = typename safetensors_detail::Json<Deferred>::type;
  const std::string where = "accel::save_model: " + dir.string() + ": ";
  accel::detail::require(options.max_shard_size > 0, where + "max_shard_size must be positive");
  if (std::filesystem::is_regular_file(dir)) throw InvalidArgument(where + "is a file; save_model writes a directory");
  const auto state = model_state(model);
  accel::detail::require(!state.empty(), where + "the model has no parameters and no buffers: nothing to save");
  const auto plan = plan_shards(state, options.max_shard_size);
  std::filesystem::create_directories(dir);
  std::set<std::string> written;
  for (const auto& f : plan.files) written.insert(f.first);
  if (plan.sharded()) written.insert(safe_weights_index_name);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto f = entry.path().filename().string();
    const bool ours = safetensors_detail::is_shard_name(f) || f == safe_weights_name || f == safe_weights_index_name;
    if (ours && entry.is_regular_file() && !written.count(f)) std::filesystem::remove(entry.path());
  }
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : state) by_name.emplace(name, &t);
  json weight_map = json::object();
  for (const auto& [file, names] : plan.files) {
    TensorMap shard;
    for (const auto& n : names) {
      shard.emplace(n, *by_name.at(n));
      weight_map[n] = file;
    }
    write_safetensors<Deferred>(dir / file, shard, options.metadata);
  }
  if (plan.sharded()) {
    // json.dumps(index, indent=2, sort_keys=True) + "\n", as Accelerate writes it.
    const json index{{"metadata", {{"total_size", plan.total_size}}}, {"weight_map", weight_map}};
    std::ofstream out(dir / safe_weights_index_name, std::ios::trunc);
    out << index.dump(2, ' ', /*ensure_ascii=*/true) << "\n";
    out.close();
    if (!out) safetensors_detail::fail(dir / safe_weights_index_name, "could not be written completely (disk full?)");
  }
  return plan;
}

template <class Deferred>
void load_model(torch::nn::Module& model, const std::filesystem::path& path, const LoadModelOptions& options) {
  namespace fs = std::filesystem;
  using json = typename safetensors_detail::Json<Deferred>::type;
  const std::string who = "accel::load_model: ";
  // name -> file, from the index, or every name of the one file.
  std::vector<fs::path> files;
  std::map<std::string, fs::path> indexed;
  fs::path index;
  if (fs::is_directory(path)) {
    if (fs::exists(path / safe_weights_index_name)) index = path / safe_weights_index_name;
    else if (fs::exists(path / safe_weights_name)) files.push_back(path / safe_weights_name);
    else
      throw SafetensorsError(who + path.string() + " holds neither " + safe_weights_name + " nor " +
                             safe_weights_index_name);
  } else if (!fs::exists(path)) {
    throw SafetensorsError(who + path.string() + " does not exist");
  } else if (path.string().ends_with(".index.json")) {
    index = path;
  } else {
    files.push_back(path);
  }
  if (!index.empty()) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const typename json::parse_error& e) {
      safetensors_detail::fail(index, std::string("the index is not JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      safetensors_detail::fail(index, "the index has no \"weight_map\" object");
    std::set<std::string> seen;
    for (const auto& [name, f] : j["weight_map"].items()) {
      if (!f.is_string()) safetensors_detail::fail(index, "weight_map[\"" + name + "\"] is not a file name");
      const auto file = index.parent_path() / f.template get<std::string>();
      indexed.emplace(name, file);
      if (seen.insert(file.string()).second) files.push_back(file);
    }
  }

  // Every header, checked, before anything is copied.
  struct Found {
    std::size_t file;
    const safetensors_detail::Entry* entry;
  };
  std::vector<safetensors_detail::Header> headers(files.size());
  std::map<std::string, Found> found;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!fs::exists(files[i])) safetensors_detail::fail(files[i], "is missing (named by " + index.string() + ")");
    std::ifstream in;
    headers[i] = safetensors_detail::read_header<Deferred>(files[i], in);
    for (const auto& e : headers[i].entries)
      if (!found.emplace(e.name, Found{i, &e}).second)
        safetensors_detail::fail(files[i], "tensor '" + e.name + "' is also in " + files[found.at(e.name).file].string());
  }
  for (const auto& [name, file] : indexed) {
    const auto it = found.find(name);
    if (it == found.end() || files[it->second.file] != file)
      safetensors_detail::fail(file, "the index names tensor '" + name + "' in this file, which does not hold it");
  }
  const auto state = model_state(model);
  std::set<std::string> used;
  std::vector<std::vector<std::pair<at::Tensor, const safetensors_detail::Entry*>>> per_file(files.size());
  for (const auto& [name, target] : state) {
    const auto it = found.find(name);
    if (it == found.end())
      throw SafetensorsError(who + path.string() + ": no tensor '" + name + "' for the module's " +
                             std::string(c10::toString(target.scalar_type())) + " " + safetensors_detail::shape_text(target.sizes().vec()));
    const auto& [file, e] = it->second;
    if (e->shape != target.sizes().vec())
      safetensors_detail::fail(files[file], "tensor '" + name + "' has shape " + safetensors_detail::shape_text(e->shape) +
                                    "; the module's is " + safetensors_detail::shape_text(target.sizes().vec()));
    if (e->dtype->type != target.scalar_type() && !options.allow_cast)
      safetensors_detail::fail(files[file], "tensor '" + name + "' is " + e->dtype->name + "; the module's is " +
                                    std::string(c10::toString(target.scalar_type())) +
                                    " (LoadModelOptions::allow_cast converts it)");
    used.insert(name);
    per_file[file].emplace_back(target, e);
  }
  if (options.strict)
    for (const auto& [name, f] : found)
      if (!used.count(name))
        safetensors_detail::fail(files[f.file], "tensor '" + name + "' matches no parameter or buffer of the module "
                                    "(LoadModelOptions::strict = false ignores it)");
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (per_file[i].empty()) continue;
    std::ifstream in(files[i], std::ios::binary);
    for (auto& [target, e] : per_file[i]) target.copy_(safetensors_detail::read_entry(files[i], in, headers[i], *e));
  }
}

}  // namespace accel::checkpoint
