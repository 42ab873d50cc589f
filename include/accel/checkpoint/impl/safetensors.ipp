#pragma once
//! \file
//! The definitions of checkpoint/safetensors.hpp (included at its end): `save_model`, `load_model`,
//! `save_safetensors_sharded` and `load_safetensors_sharded` (Note [One save, one load]), which use
//! nlohmann-json (the index file; Note [JSON at the call site] in checkpoint/safetensors_format.hpp), and `parse_size`,
//! `unique_storages`, `model_state`, `plan_shards` (11 MB of g++'s 2,000 per translation unit), kept out of user code
//! under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/checkpoint/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <string_view>

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

ACCEL_DECL NamedTensors unique_storages(const NamedTensors& tensors) {
  NamedTensors out;
  std::set<std::tuple<int, int, const void*, std::size_t>> storages;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    // The storage's identity, as huggingface's id_tensor_storage: device, data pointer, size. A storage of no
    // bytes holds nothing to share, so empty tensors are always kept.
    const auto& s = t.storage();
    if (s.nbytes() > 0 &&
        !storages.emplace(int(t.device().type()), int(t.device().index()), s.data(), s.nbytes()).second)
      continue;
    out.emplace_back(name, t);
  }
  return out;
}

ACCEL_DECL NamedTensors model_state(const torch::nn::Module& model) {
  NamedTensors all;
  auto visit = [&](auto& self, const torch::nn::Module& m, const std::string& prefix) -> void {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) all.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : m.named_buffers(/*recurse=*/false)) all.emplace_back(prefix + b.key(), b.value());
    for (const auto& c : m.named_children()) self(self, *c.value(), prefix + c.key() + ".");
  };
  visit(visit, model, "");
  return unique_storages(all);
}

ACCEL_DECL ShardPlan plan_shards(const NamedTensors& state, std::int64_t max_shard_size, const std::string& stem,
                                 const std::string& extension) {
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

inline constexpr std::string_view extension = ".safetensors";

//! The stem of `weights_name` ("model" of "model.safetensors"), which must be a file name ending in .safetensors.
inline std::string weights_stem(const std::string& weights_name, const std::string& who) {
  const bool plain = weights_name.find_first_of("/\\") == std::string::npos;
  if (!plain || weights_name.size() <= extension.size() || !weights_name.ends_with(extension) ||
      weights_name.starts_with("."))
    throw InvalidArgument(who + "weights_name '" + weights_name +
                          "' must be a file name <stem>.safetensors (no directory), e.g. \"model.safetensors\"");
  return weights_name.substr(0, weights_name.size() - extension.size());
}

//! `model-00001-of-00003.safetensors`: a shard name of huggingface's pattern, for `stem` "model".
inline bool is_shard_name(const std::string& f, const std::string& stem) {
  const std::size_t n = stem.size();
  auto digits = [&](std::size_t pos) {
    return std::all_of(f.begin() + std::ptrdiff_t(pos), f.begin() + std::ptrdiff_t(pos + 5),
                       [](unsigned char c) { return std::isdigit(c) != 0; });
  };
  return f.size() == n + 27 && f.starts_with(stem + "-") && digits(n + 1) && f.compare(n + 6, 4, "-of-") == 0 &&
         digits(n + 10) && f.ends_with(extension);
}

// Note [One save, one load]: save_model and save_safetensors_sharded are `save_sharded` after their own checks of
// what they were given (a module's state, a map's tensors, storages shared kept once); load_model and
// load_safetensors_sharded are `open_checkpoint`, which finds and checks every file, then their own use of the
// tensors it found. So a module and a map are saved in the same files and read under the same checks.

//! Writes `state` (storages already unique, not empty) into `dir`: the files of `plan_shards`, the index when
//! there are several, and removes what a previous save of the same `weights_name` left that this one does not
//! replace. `who` begins every message.
template <class Deferred>
ShardPlan save_sharded(const NamedTensors& state, const std::filesystem::path& dir, const SaveModelOptions& options,
                       const std::string& who) {
  using json = typename Json<Deferred>::type;
  const std::string where = who + dir.string() + ": ";
  accel::detail::require(options.max_shard_size > 0, where + "max_shard_size must be positive");
  const auto stem = weights_stem(options.weights_name, where);
  const std::string index_name = options.weights_name + ".index.json";
  if (std::filesystem::is_regular_file(dir)) throw InvalidArgument(where + "is a file; a checkpoint is a directory");
  const auto plan = plan_shards(state, options.max_shard_size, stem, std::string(extension));
  std::filesystem::create_directories(dir);
  std::set<std::string> written;
  for (const auto& f : plan.files) written.insert(f.first);
  if (plan.sharded()) written.insert(index_name);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto f = entry.path().filename().string();
    const bool ours = is_shard_name(f, stem) || f == options.weights_name || f == index_name;
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
    std::ofstream out(dir / index_name, std::ios::trunc);
    out << index.dump(2, ' ', /*ensure_ascii=*/true) << "\n";
    out.close();
    if (!out) fail(dir / index_name, "could not be written completely (disk full?)");
  }
  return plan;
}

//! A checkpoint's files, every header read and checked, and where each tensor is.
struct Opened {
  struct Found {
    std::size_t file, entry;  // files[file], headers[file].entries[entry]
  };
  std::vector<std::filesystem::path> files;
  std::vector<Header> headers;
  std::map<std::string, Found> found;
  [[nodiscard]] const Entry& entry(const Found& f) const { return headers[f.file].entries[f.entry]; }
};

//! The files of the checkpoint at `path` (see load_safetensors_sharded), each checked, and the index checked
//! against them: nothing is read but the headers.
template <class Deferred>
Opened open_checkpoint(const std::filesystem::path& path, const std::string& weights_name, const std::string& who) {
  namespace fs = std::filesystem;
  using json = typename Json<Deferred>::type;
  (void)weights_stem(weights_name, who + path.string() + ": ");
  const std::string index_name = weights_name + ".index.json";
  Opened o;
  std::map<std::string, std::size_t> indexed;  // name -> file
  fs::path index;
  if (fs::is_directory(path)) {
    if (fs::exists(path / index_name))
      index = path / index_name;
    else if (fs::exists(path / weights_name))
      o.files.push_back(path / weights_name);
    else
      throw SafetensorsError(who + path.string() + " holds neither " + weights_name + " nor " + index_name +
                             " (another weights_name?)");
  } else if (!fs::exists(path)) {
    throw SafetensorsError(who + path.string() + " does not exist");
  } else if (path.string().ends_with(".index.json")) {
    index = path;
  } else {
    o.files.push_back(path);
  }
  if (!index.empty()) {
    std::error_code ec;
    const auto size = fs::file_size(index, ec);
    if (ec) fail(index, "cannot be read (" + ec.message() + ")");
    if (size > max_index_size)
      fail(index, "the index has " + std::to_string(size) + " bytes, over the " + std::to_string(max_index_size) +
                      " an index of a million tensors takes (a damaged file, or not an index)");
    std::ifstream in(index, std::ios::binary);
    if (!in) fail(index, "cannot be opened for reading");
    json j;
    try {
      j = json::parse(in);
    } catch (const typename json::parse_error& e) {
      fail(index, std::string("the index is not JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index, "the index has no \"weight_map\" object");
    if (j["weight_map"].empty()) fail(index, "the index's weight_map names no tensor");
    std::map<std::string, std::size_t> file_number;
    for (const auto& [name, f] : j["weight_map"].items()) {
      if (!f.is_string()) fail(index, "weight_map[\"" + name + "\"] is not a file name");
      const auto file = f.template get<std::string>();
      if (file.empty() || file == "." || file == ".." ||
          file.find_first_of(std::string_view("/\\\0", 3)) != std::string::npos)
        fail(index, "weight_map[\"" + name + "\"] is '" + file +
                        "': a shard must be a file beside the index (no '/', '\\', '..' or NUL); rewrite the index or "
                        "move the shard");
      const auto [it, added] = file_number.emplace(file, o.files.size());
      if (added) o.files.push_back(index.parent_path() / file);
      indexed.emplace(name, it->second);
    }
  }
  o.headers.resize(o.files.size());
  for (std::size_t i = 0; i < o.files.size(); ++i) {
    std::error_code ec;
    if (!index.empty() && !fs::exists(o.files[i], ec))
      fail(o.files[i], ec ? "cannot be read (" + ec.message() + ")"
                          : "is missing (named by " + index.string() + "; copy it beside the index)");
    std::ifstream in;
    o.headers[i] = read_header<Deferred>(o.files[i], in);
    const auto& entries = o.headers[i].entries;
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const auto& name = entries[k].name;
      if (const auto [it, added] = o.found.emplace(name, Opened::Found{i, k}); !added)
        fail(o.files[i], "tensor '" + name + "' is also in " + o.files[it->second.file].string() +
                             " (a name may be in one file only; remove it from one of them)");
      if (!index.empty()) {
        const auto at = indexed.find(name);
        if (at == indexed.end())
          fail(o.files[i], "holds tensor '" + name + "', which the index " + index.string() +
                               " does not name (a shard of another save? save again, or add it to the index)");
      }
    }
  }
  for (const auto& [name, file] : indexed) {
    const auto it = o.found.find(name);
    if (it == o.found.end() || it->second.file != file)
      fail(o.files[file], "the index names tensor '" + name + "' in this file, which does not hold it" +
                              (it == o.found.end() ? std::string(" (nor does any other shard)")
                                                   : " (" + o.files[it->second.file].string() + " does)"));
  }
  return o;
}

}  // namespace safetensors_detail

template <class Deferred>
ShardPlan save_model(const torch::nn::Module& model, const std::filesystem::path& dir,
                     const SaveModelOptions& options) {
  const std::string who = "accel::save_model: ";
  const auto state = model_state(model);
  accel::detail::require(!state.empty(),
                         who + dir.string() + ": the model has no parameters and no buffers: nothing to save");
  return safetensors_detail::save_sharded<Deferred>(state, dir, options, who);
}

template <class Deferred>
ShardPlan save_safetensors_sharded(const NamedTensors& tensors, const std::filesystem::path& dir,
                                   const SaveShardedOptions& options) {
  const std::string who = "accel::save_safetensors_sharded: ";
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second)
      throw InvalidArgument(who + dir.string() + ": tensor '" + name + "' is named twice");
    if (!t.defined())
      throw InvalidArgument(who + dir.string() + ": tensor '" + name +
                            "' is undefined; safetensors stores only tensors with data");
  }
  const auto state = unique_storages(tensors);
  accel::detail::require(!state.empty(), who + dir.string() + ": no tensors: nothing to save");
  return safetensors_detail::save_sharded<Deferred>(state, dir, options, who);
}

template <class Deferred>
ShardPlan save_safetensors_sharded(const TensorMap& tensors, const std::filesystem::path& dir,
                                   const SaveShardedOptions& options) {
  return save_safetensors_sharded<Deferred>(NamedTensors(tensors.begin(), tensors.end()), dir, options);
}

template <class Deferred>
TensorMap load_safetensors_sharded(const std::filesystem::path& path, const std::string& weights_name) {
  const auto o = safetensors_detail::open_checkpoint<Deferred>(path, weights_name, "accel::load_safetensors_sharded: ");
  TensorMap out;
  for (std::size_t i = 0; i < o.files.size(); ++i) {
    std::ifstream in(o.files[i], std::ios::binary);
    for (const auto& e : o.headers[i].entries)
      out.emplace(e.name, safetensors_detail::read_entry(o.files[i], in, o.headers[i], e));
  }
  return out;
}

template <class Deferred>
void load_model(torch::nn::Module& model, const std::filesystem::path& path, const LoadModelOptions& options) {
  const std::string who = "accel::load_model: ";
  const auto o = safetensors_detail::open_checkpoint<Deferred>(path, options.weights_name, who);
  const auto& files = o.files;
  const auto state = model_state(model);
  std::set<std::string> used;
  std::vector<std::vector<std::pair<at::Tensor, const safetensors_detail::Entry*>>> per_file(files.size());
  for (const auto& [name, target] : state) {
    const auto it = o.found.find(name);
    if (it == o.found.end())
      throw SafetensorsError(who + path.string() + ": no tensor '" + name + "' for the module's " +
                             std::string(c10::toString(target.scalar_type())) + " " +
                             safetensors_detail::shape_text(target.sizes().vec()));
    const auto file = it->second.file;
    const auto* e = &o.entry(it->second);
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
    for (const auto& [name, f] : o.found)
      if (!used.count(name))
        safetensors_detail::fail(files[f.file], "tensor '" + name +
                                                    "' matches no parameter or buffer of the module "
                                                    "(LoadModelOptions::strict = false ignores it)");
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (per_file[i].empty()) continue;
    std::ifstream in(files[i], std::ios::binary);
    for (auto& [target, e] : per_file[i]) target.copy_(safetensors_detail::read_entry(files[i], in, o.headers[i], *e));
  }
}

}  // namespace accel::checkpoint
