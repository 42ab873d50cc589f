// Safetensors (checkpoint/safetensors.hpp): files written and read back byte for byte in safetensors' layout, every
// dtype; Accelerate's sharding rule; save_model/load_model by name; and every kind of bad file refused with one
// error naming the file and the problem. (Files against Python's safetensors and Accelerate: tests/interop.)
#include "../../support/files.hpp"

#include <accel/checkpoint/safetensors.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace ck = accel::checkpoint;

namespace {

fs::path scratch(const std::string& name) { return test_files::scratch("safetensors", name); }
using test_files::bytes_of;

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

//! A file of `header` (its length written as `length`, the true one by default) followed by `data`.
fs::path raw_file(const fs::path& p, const std::string& header, const std::string& data, std::uint64_t length = ~0ull) {
  if (length == ~0ull) length = header.size();
  std::ofstream out(p, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(char((length >> (8 * i)) & 0xFF));
  out << header << data;
  return p;
}

//! The message of the SafetensorsError that reading `p` raises ("" if none).
std::string read_error(const fs::path& p) {
  try {
    (void)ck::read_safetensors(p);
  } catch (const ck::SafetensorsError& e) {
    return e.what();
  }
  return "";
}

torch::nn::Sequential small_net() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 3));
}

}  // namespace

TEST_CASE("safetensors: every dtype, scalars and empty tensors are written and read back bit for bit",
          "[safetensors]") {
  const auto dir = scratch("dtypes");
  at::manual_seed(3);
  const auto f = at::randn({3, 5});
  ck::TensorMap in{{"f32", f},
                   {"f16", f.to(at::kHalf)},
                   {"bf16", f.to(at::kBFloat16)},
                   {"f64", f.to(at::kDouble)},
                   {"i64", at::arange(-6, 6, at::kLong).reshape({2, 6})},
                   {"i32", at::arange(7, at::kInt)},
                   {"u8", at::arange(200, 210).to(at::kByte)},
                   {"bool", f.gt(0)},
                   {"scalar", at::scalar_tensor(2.5)},
                   {"empty", at::empty({0, 4})},
                   {"strided", f.t()}};  // not contiguous: written in row-major order of its own shape
  ck::write_safetensors(dir / "a.safetensors", in);
  const auto out = ck::read_safetensors(dir / "a.safetensors");
  REQUIRE(out.size() == in.size());
  for (const auto& [name, t] : in) {
    INFO(name);
    CHECK(same_bytes(out.at(name), t.contiguous()));
  }
  CHECK(ck::read_safetensors_metadata(dir / "a.safetensors") == ck::Metadata{{"format", "pt"}});
  CHECK(out.at("scalar").dim() == 0);
}

TEST_CASE("safetensors: the layout is safetensors' (8-byte header, padding, larger dtypes first, then by name)",
          "[safetensors]") {
  const auto dir = scratch("layout");
  ck::write_safetensors(dir / "l.safetensors",
                        {{"b", at::zeros({3}, at::kByte)},
                         {"a", at::zeros({1}, at::kByte)},
                         {"z", at::zeros({2}, at::kLong)},
                         {"h", at::zeros({1}, at::kHalf)},
                         {"c", at::zeros({5}, at::kFloat)}},
                        {});
  const auto bytes = bytes_of(dir / "l.safetensors");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[std::size_t(i)]);
  CHECK(n % 8 == 0);
  const auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  CHECK_FALSE(header.contains("__metadata__"));  // empty metadata: none written
  std::vector<std::string> order;
  for (const auto& [k, v] : header.items()) order.push_back(k);
  CHECK(order == std::vector<std::string>{"z", "c", "h", "a", "b"});
  CHECK(header["c"]["data_offsets"] == nlohmann::json::array({16, 36}));
  CHECK(bytes.size() == 8 + n + 16 + 20 + 2 + 1 + 3);
}

TEST_CASE("safetensors: shards split as huggingface_hub's split_torch_state_dict_into_shards", "[safetensors]") {
  // Sizes (bytes) 40, 40, 120, 40, 40 under 100: 120 is over the limit and goes into a shard of its own as it is
  // met, before the shard being filled ([40 40]), which is closed when the next 40 would take it over 100.
  std::vector<std::pair<std::string, at::Tensor>> state{{"a", at::zeros({10})},
                                                        {"b", at::zeros({10})},
                                                        {"big", at::zeros({30})},
                                                        {"c", at::zeros({10})},
                                                        {"d", at::zeros({10})}};
  const auto plan = ck::plan_shards(state, 100);
  REQUIRE(plan.files.size() == 3);
  CHECK(plan.files[0] == std::pair<std::string, std::vector<std::string>>{"model-00001-of-00003.safetensors", {"big"}});
  CHECK(plan.files[1].second == std::vector<std::string>{"a", "b"});
  CHECK(plan.files[2].second == std::vector<std::string>{"c", "d"});
  CHECK(plan.files[2].first == "model-00003-of-00003.safetensors");
  CHECK(plan.total_size == 280);
  const auto one = ck::plan_shards(state, 1000);
  CHECK(one.files.size() == 1);
  CHECK(one.files[0].first == "model.safetensors");
  CHECK_FALSE(one.sharded());
  CHECK(ck::parse_size("10GB") == ck::default_max_shard_size);
  CHECK(ck::parse_size(" 1.5 kb") == 1500);
  CHECK_THROWS_WITH(ck::parse_size("12XB"), Catch::Contains("must be one of TB, GB, MB, KB"));
}

TEST_CASE("safetensors: save_model and load_model by name, sharded or not; stale files of a previous save removed",
          "[safetensors]") {
  const auto dir = scratch("model");
  at::manual_seed(1);
  auto a = small_net();
  a->named_buffers()["1.running_mean"].fill_(0.25);
  auto b = small_net();
  const auto sharded = ck::save_model(*a, dir / "sharded", {.max_shard_size = 100});
  REQUIRE(sharded.sharded());
  CHECK(fs::exists(dir / "sharded" / ck::safe_weights_index_name));
  const auto index = nlohmann::json::parse(std::ifstream(dir / "sharded" / ck::safe_weights_index_name));
  CHECK(index["metadata"]["total_size"] == sharded.total_size);
  CHECK(index["weight_map"].size() == 9);  // 2 + (2 + 3 buffers) + 2
  for (const auto& [file, names] : sharded.files)
    for (const auto& n : names) CHECK(index["weight_map"][n] == file);
  ck::load_model(*b, dir / "sharded");
  for (const auto& [name, t] : ck::model_state(*a)) {
    INFO(name);
    CHECK(same_bytes(t, b->named_parameters().contains(name) ? b->named_parameters()[name] : b->named_buffers()[name]));
  }
  // A smaller save into the same directory: the old shards and index go, the single file is what loads.
  ck::save_model(*a, dir / "sharded");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir / "sharded")) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"model.safetensors"});
  auto c = small_net();
  ck::load_model(*c, dir / "sharded" / "model.safetensors");
  CHECK(same_bytes(c->named_parameters()["2.weight"], a->named_parameters()["2.weight"]));
}

TEST_CASE("safetensors: load_model refuses a file that does not fit the module, before copying anything",
          "[safetensors]") {
  const auto dir = scratch("fit");
  auto net = small_net();
  const auto before = net->named_parameters()["0.weight"].clone();
  auto state = ck::model_state(*net);
  ck::TensorMap full(state.begin(), state.end());
  auto attempt = [&](ck::TensorMap m, ck::LoadModelOptions o = {}) -> std::string {
    for (auto& [k, v] : m) v = v.clone().fill_(7);
    ck::write_safetensors(dir / "m.safetensors", m);
    try {
      ck::load_model(*net, dir / "m.safetensors", o);
    } catch (const ck::SafetensorsError& e) {
      return e.what();
    }
    return "";
  };
  auto missing = full;
  missing.erase("2.bias");
  CHECK_THAT(attempt(missing), Catch::Contains("no tensor '2.bias'") && Catch::Contains("m.safetensors"));
  auto reshaped = full;
  reshaped["0.weight"] = at::zeros({4, 8});
  CHECK_THAT(attempt(reshaped), Catch::Contains("tensor '0.weight' has shape [4, 8]; the module's is [8, 4]"));
  auto other_dtype = full;
  other_dtype["0.weight"] = other_dtype["0.weight"].to(at::kDouble);
  CHECK_THAT(attempt(other_dtype), Catch::Contains("tensor '0.weight' is F64; the module's is Float"));
  auto extra = full;
  extra["head.weight"] = at::zeros({1});
  CHECK_THAT(attempt(extra), Catch::Contains("tensor 'head.weight' matches no parameter or buffer"));
  CHECK(same_bytes(net->named_parameters()["0.weight"], before));  // nothing copied by a refused load
  CHECK(attempt(extra, {.strict = false}).empty());
  CHECK(attempt(other_dtype, {.allow_cast = true}).empty());
  CHECK(net->named_parameters()["0.weight"].scalar_type() == at::kFloat);
  CHECK(net->named_parameters()["0.weight"].eq(7).all().item<bool>());
  CHECK(attempt(full).empty());
}

TEST_CASE("safetensors: every kind of bad file is one error naming the file and the problem", "[safetensors]") {
  const auto dir = scratch("bad");
  const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, '\1');
  {
    std::ofstream(dir / "short.safetensors") << "abc";
    CHECK_THAT(read_error(dir / "short.safetensors"), Catch::Contains("short.safetensors: truncated: 3 bytes"));
  }
  CHECK_THAT(read_error(raw_file(dir / "long.safetensors", ok_header, eight, 1ull << 62)),
             Catch::Contains("long.safetensors: the header length is 4611686018427387904 bytes but only"));
  CHECK_THAT(read_error(raw_file(dir / "cut.safetensors", ok_header, eight, ok_header.size() + 20)),
             Catch::Contains("cut.safetensors: the header length is") && Catch::Contains("but only"));
  CHECK_THAT(read_error(raw_file(dir / "brace.safetensors", "[1, 2]  ", "")),
             Catch::Contains("brace.safetensors: the header does not start with '{'"));
  CHECK_THAT(read_error(raw_file(dir / "json.safetensors", R"({"a": {"dtype": )", "")),
             Catch::Contains("json.safetensors: the header is not JSON"));
  CHECK_THAT(read_error(raw_file(dir / "dtype.safetensors", R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})",
                                 eight)),
             Catch::Contains("dtype.safetensors: tensor 'a': unknown dtype 'F7'"));
  CHECK_THAT(
      read_error(
          raw_file(dir / "span.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight)),
      Catch::Contains("span.safetensors: tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets [0, 8) span 8"));
  CHECK_THAT(
      read_error(raw_file(dir / "huge.safetensors",
                          R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight)),
      Catch::Contains(
          "huge.safetensors: tensor 'a': shape [4294967296, 4294967296] of F32 needs more than 2^64 bytes"));
  CHECK_THAT(read_error(raw_file(dir / "range.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight)),
             Catch::Contains(
                 "range.safetensors: tensor 'a': data_offsets [0, 16) are out of range: the data section has 8 bytes"));
  CHECK_THAT(
      read_error(raw_file(
          dir / "overlap.safetensors",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          eight)),
      Catch::Contains("overlap.safetensors: tensor 'b' (bytes 4 to 8) overlaps tensor 'a'"));
  CHECK_THAT(
      read_error(raw_file(dir / "gap.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight)),
      Catch::Contains("gap.safetensors: bytes 0 to 4 of the data section belong to no tensor"));
  CHECK_THAT(read_error(raw_file(dir / "tail.safetensors", ok_header, eight + "xyz")),
             Catch::Contains("tail.safetensors: the data section has 11 bytes but the tensors cover 8"));
  CHECK_THAT(read_error(raw_file(dir / "offsets.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})",
                                 eight)),
             Catch::Contains("offsets.safetensors: tensor 'a': data_offsets is not a pair"));
  CHECK_THAT(read_error(raw_file(dir / "meta.safetensors", R"({"__metadata__":{"format":1}})", "")),
             Catch::Contains("meta.safetensors: __metadata__[\"format\"] is not a string"));
  CHECK(read_error(raw_file(dir / "good.safetensors", ok_header, eight)).empty());  // the same bytes, well formed, read
  // A sharded checkpoint whose index names a tensor in a file that lacks it, and one whose shard is gone.
  auto net = small_net();
  ck::save_model(*net, dir / "idx", {.max_shard_size = 100});
  auto index = nlohmann::json::parse(std::ifstream(dir / "idx" / ck::safe_weights_index_name));
  index["weight_map"]["0.bias"] = index["weight_map"]["2.weight"];
  std::ofstream(dir / "idx" / ck::safe_weights_index_name) << index.dump();
  CHECK_THROWS_WITH(ck::load_model(*net, dir / "idx"),
                    Catch::Contains("the index names tensor '0.bias' in this file, which does not hold it"));
  index["weight_map"]["0.bias"] = "model-00009-of-00009.safetensors";
  std::ofstream(dir / "idx" / ck::safe_weights_index_name) << index.dump();
  CHECK_THROWS_WITH(ck::load_model(*net, dir / "idx"), Catch::Contains("model-00009-of-00009.safetensors: is missing"));
  CHECK_THROWS_WITH(ck::load_model(*net, dir / "nowhere"), Catch::Contains("nowhere does not exist"));
}

namespace {

//! Every file of `dir` by name, with its bytes.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = bytes_of(e.path());
  return out;
}

//! The message of the SafetensorsError that load_safetensors_sharded(p) raises ("" if none).
std::string load_error(const fs::path& p) {
  try {
    (void)ck::load_safetensors_sharded(p);
  } catch (const ck::SafetensorsError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: a map saved sharded or whole is the module's files, and a directory loads into one map",
          "[safetensors]") {
  const auto dir = scratch("maps");
  at::manual_seed(5);
  auto net = small_net();
  // The map path and the module path write the same bytes for the same state (one implementation).
  const auto state = ck::model_state(*net);
  for (const std::int64_t limit : {std::int64_t(100), ck::default_max_shard_size}) {
    INFO(limit);
    const auto sub = std::to_string(limit);
    const auto a = ck::save_model(*net, dir / ("module" + sub), {.max_shard_size = limit});
    const auto b = ck::save_safetensors_sharded(state, dir / ("map" + sub), {.max_shard_size = limit});
    CHECK(a.files == b.files);
    CHECK(tree(dir / ("module" + sub)) == tree(dir / ("map" + sub)));
    const auto back = ck::load_safetensors_sharded(dir / ("map" + sub));
    REQUIRE(back.size() == state.size());
    for (const auto& [name, t] : state) {
      INFO(name);
      CHECK(same_bytes(back.at(name), t));
    }
  }
  // The index file, a shard alone and a single file are paths too.
  CHECK(ck::load_safetensors_sharded(dir / "map100" / ck::safe_weights_index_name).size() == state.size());
  const auto first = ck::plan_shards(state, 100).files.front();  // model-00001-of-00005.safetensors
  CHECK(ck::load_safetensors_sharded(dir / "map100" / first.first).size() == first.second.size());
  CHECK(ck::load_safetensors_sharded(dir / ("map" + std::to_string(ck::default_max_shard_size)) / "model.safetensors")
            .size() == state.size());

  // A TensorMap splits in name order; storage shared with an earlier name is saved once, under that name.
  const auto w = at::randn({4, 4});
  ck::TensorMap tied{{"a.weight", w}, {"b.weight", w}, {"c.bias", at::randn({30})}, {"d", at::zeros({0})}};
  const auto plan = ck::save_safetensors_sharded(tied, dir / "tied", {.max_shard_size = 100});
  REQUIRE(plan.files.size() == 2);
  CHECK(plan.files[0].second == std::vector<std::string>{"c.bias"});  // over the limit: a shard of its own, now
  CHECK(plan.files[1].second == std::vector<std::string>{"a.weight", "d"});
  CHECK(plan.total_size == 64 + 120);
  const auto loaded = ck::load_safetensors_sharded(dir / "tied");
  CHECK(loaded.size() == 3);
  CHECK_FALSE(loaded.contains("b.weight"));
  CHECK(same_bytes(loaded.at("a.weight"), w));

  // Another weights_name: its own shards and index, and a save of it leaves model.* alone.
  ck::save_safetensors_sharded(tied, dir / "tied", {.max_shard_size = 100, .weights_name = "adapter.safetensors"});
  std::vector<std::string> names;
  for (const auto& [f, bytes] : tree(dir / "tied")) names.push_back(f);
  CHECK(names == std::vector<std::string>{"adapter-00001-of-00002.safetensors", "adapter-00002-of-00002.safetensors",
                                          "adapter.safetensors.index.json", "model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors", "model.safetensors.index.json"});
  CHECK(ck::load_safetensors_sharded(dir / "tied", "adapter.safetensors").size() == 3);
  ck::save_safetensors_sharded(tied, dir / "tied", {.weights_name = "adapter.safetensors"});
  CHECK(fs::exists(dir / "tied" / "adapter.safetensors"));
  CHECK_FALSE(fs::exists(dir / "tied" / "adapter.safetensors.index.json"));
  CHECK(fs::exists(dir / "tied" / ck::safe_weights_index_name));
  CHECK_THAT(load_error(dir / "nothing_here"), Catch::Contains("nothing_here does not exist"));
  fs::create_directories(dir / "empty");
  CHECK_THAT(load_error(dir / "empty"),
             Catch::Contains("holds neither model.safetensors nor model.safetensors.index.json"));
  CHECK_THROWS_WITH(ck::save_safetensors_sharded(tied, dir / "x", {.weights_name = "../model.safetensors"}),
                    Catch::Contains("must be a file name <stem>.safetensors"));
  CHECK_THROWS_WITH(ck::save_safetensors_sharded(ck::TensorMap{}, dir / "x"), Catch::Contains("nothing to save"));
  CHECK_THROWS_WITH(ck::save_safetensors_sharded(ck::NamedTensors{{"a", w}, {"a", w}}, dir / "x"),
                    Catch::Contains("tensor 'a' is named twice"));
}

TEST_CASE("safetensors: a directory whose index and shards disagree is refused naming the file and the fix",
          "[safetensors]") {
  const auto dir = scratch("forged");
  ck::TensorMap map{{"a", at::randn({10})}, {"b", at::randn({10})}, {"c", at::randn({10})}, {"d", at::randn({10})}};
  const std::string one = "model-00001-of-00002.safetensors", two = "model-00002-of-00002.safetensors";
  auto fresh = [&](const std::string& name) {  // [a b] in one, [c d] in two
    ck::save_safetensors_sharded(map, dir / name, {.max_shard_size = 80});
    return nlohmann::json::parse(std::ifstream(dir / name / ck::safe_weights_index_name));
  };
  auto rewrite = [&](const std::string& name, const nlohmann::json& index) {
    std::ofstream(dir / name / ck::safe_weights_index_name) << index.dump();
    return load_error(dir / name);
  };
  // A shard outside the directory, however spelled.
  ck::write_safetensors(dir / "outside.safetensors", {{"a", at::zeros({10})}});
  for (const std::string bad : {"../outside.safetensors", "/abs/outside.safetensors", "..", "sub/x.safetensors",
                                "..\\outside.safetensors", ""}) {
    INFO(bad);
    auto index = fresh("out");
    index["weight_map"]["a"] = bad;
    CHECK_THAT(rewrite("out", index),
               Catch::Contains("model.safetensors.index.json: weight_map[\"a\"] is '" + bad + "'") &&
                   Catch::Contains("a shard must be a file beside the index"));
  }
  // A tensor the index names that no shard holds.
  auto index = fresh("missing");
  index["weight_map"]["z"] = one;
  CHECK_THAT(rewrite("missing", index), Catch::Contains(one + ": the index names tensor 'z' in this file, which does "
                                                              "not hold it (nor does any other shard)"));
  // A tensor named in one shard, held by the other.
  index["weight_map"].erase("z");
  index["weight_map"]["a"] = two;
  CHECK_THAT(rewrite("missing", index),
             Catch::Contains(two + ": the index names tensor 'a' in this file, which does not hold it (") &&
                 Catch::Contains(one + " does)"));
  // A shard holding a tensor the index does not name.
  index = fresh("extra");
  index["weight_map"].erase("b");
  CHECK_THAT(rewrite("extra", index),
             Catch::Contains(one + ": holds tensor 'b', which the index") && Catch::Contains("does not name"));
  // The same name in two shards.
  fresh("twice");
  ck::write_safetensors(dir / "twice" / two, {{"a", at::zeros({10})}, {"c", at::zeros({10})}});
  CHECK_THAT(load_error(dir / "twice"), Catch::Contains(two + ": tensor 'a' is also in") &&
                                            Catch::Contains(one + " (a name may be in one file only"));
  // A shard gone, an index that is not one, an empty weight_map, a damaged shard.
  fresh("gone");
  fs::remove(dir / "gone" / two);
  CHECK_THAT(load_error(dir / "gone"), Catch::Contains(two + ": is missing (named by"));
  CHECK_THAT(rewrite("gone", nlohmann::json::array()), Catch::Contains("the index has no \"weight_map\" object"));
  CHECK_THAT(rewrite("gone", {{"weight_map", nlohmann::json::object()}}),
             Catch::Contains("the index's weight_map names no tensor"));
  fresh("cut");
  fs::resize_file(dir / "cut" / two, 20);
  CHECK_THAT(load_error(dir / "cut"), Catch::Contains(two + ": the header length is"));
  // load_model reads through the same checks.
  index = fresh("model");
  index["weight_map"]["a"] = "../outside.safetensors";
  std::ofstream(dir / "model" / ck::safe_weights_index_name) << index.dump();
  auto net = small_net();
  CHECK_THROWS_WITH(ck::load_model(*net, dir / "model"), Catch::Contains("a shard must be a file beside the index"));
}
