#pragma once
//! \file
//! The definitions of checkpoint/safetensors.hpp (included at its end): `save_model` and `load_model`, which use
//! nlohmann-json (the index file; Note [JSON at the call site] in checkpoint/safetensors_format.hpp), and `parse_size`,
//! `model_state`, `plan_shards` (11 MB of g++'s 2,000 per translation unit), kept out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/checkpoint/safetensors.hpp>

#include <nlohmann/json.hpp>

namespace accel::checkpoint {

ACCEL_DECL std::int64_t parse_size(const std::string& text) {
  const std::map<std::string, double> units{{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}};
  std::string s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  std::string unit = s.size() >= 2 ? s.substr(s.size() - 2) : s;
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  const auto it = units.find(unit);
  accel::detail::require(it != units.end(), "accel: size '" + text + "': the unit must be one of TB, GB, MB, KB");
  try {
    std::size_t used = 0;
    std::string number = s.substr(0, s.size() - 2);
    while (!number.empty() && std::isspace(static_cast<unsigned char>(number.back()))) number.pop_back();
    const double v = std::stod(number, &used);
    if (used == number.size() && v >= 0) return static_cast<std::int64_t>(v * it->second);
  } catch (const std::exception&) {
  }
  throw InvalidArgument("accel: size '" + text + "': expected a non-negative number followed by a unit, e.g. \"5GB\"");
}

ACCEL_DECL std::vector<std::pair<std::string, at::Tensor>> model_state(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::set<std::tuple<int, int, const void*, std::size_t>> storages;
  auto keep = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    // The storage's identity, as huggingface's id_tensor_storage: device, data pointer, size. A storage of no
    // bytes holds nothing to share, so empty tensors are always kept.
    const auto& s = t.storage();
    if (s.nbytes() > 0 &&
        !storages.emplace(int(t.device().type()), int(t.device().index()), s.data(), s.nbytes()).second)
      return;
    out.emplace_back(name, t);
  };
  auto visit = [&](auto& self, const torch::nn::Module& m, const std::string& prefix) -> void {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) keep(prefix + p.key(), p.value());
    for (const auto& b : m.named_buffers(/*recurse=*/false)) keep(prefix + b.key(), b.value());
    for (const auto& c : m.named_children()) self(self, *c.value(), prefix + c.key() + ".");
  };
  visit(visit, model, "");
  return out;
}

ACCEL_DECL ShardPlan plan_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                 std::int64_t max_shard_size, const std::string& stem, const std::string& extension) {
  std::vector<std::vector<std::string>> shards;
  std::vector<std::string> current;
  std::int64_t current_size = 0;
  ShardPlan plan;
  for (const auto& [name, t] : state) {
    const auto size = std::int64_t(t.storage().nbytes());  // get_torch_storage_size: the storage, not the view
    if (size > max_shard_size) {  // alone, in a shard of its own, placed now (before the shard being filled)
      plan.total_size += size;
      shards.push_back({name});
      continue;
    }
    if (current_size + size > max_shard_size) {
      shards.push_back(std::move(current));
      current = {};
      current_size = 0;
    }
    current.push_back(name);
    current_size += size;
    plan.total_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  if (shards.size() == 1) {
    plan.files.emplace_back(stem + extension, std::move(shards.front()));
    return plan;
  }
  auto five = [](std::size_t i) {
    std::string s = std::to_string(i);
    return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
  };
  for (std::size_t i = 0; i < shards.size(); ++i)
    plan.files.emplace_back(stem + "-" + five(i + 1) + "-of-" + five(shards.size()) + extension, std::move(shards[i]));
  return plan;
}

namespace safetensors_detail {
//! `model-00001-of-00003.safetensors`: a shard name of huggingface's pattern.
inline bool is_shard_name(const std::string& f) {
  auto digits = [&](std::size_t pos) {
    return std::all_of(f.begin() + std::ptrdiff_t(pos), f.begin() + std::ptrdiff_t(pos + 5),
                       [](unsigned char c) { return std::isdigit(c) != 0; });
  };
  return f.size() == 32 && f.starts_with("model-") && digits(6) && f.compare(11, 4, "-of-") == 0 && digits(15) &&
         f.ends_with(".safetensors");
}
}  // namespace safetensors_detail

template <class Deferred>
ShardPlan save_model(const torch::nn::Module& model, const std::filesystem::path& dir,
                     const SaveModelOptions& options) {
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
    if (fs::exists(path / safe_weights_index_name))
      index = path / safe_weights_index_name;
    else if (fs::exists(path / safe_weights_name))
      files.push_back(path / safe_weights_name);
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
        safetensors_detail::fail(files[i],
                                 "tensor '" + e.name + "' is also in " + files[found.at(e.name).file].string());
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
                             std::string(c10::toString(target.scalar_type())) + " " +
                             safetensors_detail::shape_text(target.sizes().vec()));
    const auto& [file, e] = it->second;
    if (e->shape != target.sizes().vec())
      safetensors_detail::fail(files[file], "tensor '" + name + "' has shape " +
                                                safetensors_detail::shape_text(e->shape) + "; the module's is " +
                                                safetensors_detail::shape_text(target.sizes().vec()));
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
        safetensors_detail::fail(files[f.file], "tensor '" + name +
                                                    "' matches no parameter or buffer of the module "
                                                    "(LoadModelOptions::strict = false ignores it)");
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (per_file[i].empty()) continue;
    std::ifstream in(files[i], std::ios::binary);
    for (auto& [target, e] : per_file[i]) target.copy_(safetensors_detail::read_entry(files[i], in, headers[i], *e));
  }
}

}  // namespace accel::checkpoint
