// accel-fuzz-seeds DIR: writes one valid input per fuzz target into DIR/<target>/ (the starting corpora): a
// checkpoint saved by the Checkpointer (its manifest, model.pt and process record), a golden file's first cases and
// the index of a sharded safetensors save.
#include "common.hpp"

#include <accel/checkpoint/checkpointer.hpp>
#include <accel/checkpoint/safetensors.hpp>

#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>

#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: accel-fuzz-seeds OUT_DIR GOLDEN_DATA_DIR (tests/golden/data)\n";
    return 2;
  }
  const fs::path out = argv[1], golden = argv[2];
  const auto ckpt = out / "checkpoint";
  auto model = readers::small_model();
  accel::checkpoint::Checkpointer ck;
  ck.add_model(model.ptr());
  accel::data::LoaderState loader{1, 3, accel::generator_bytes(at::detail::getDefaultCPUGenerator())};
  ck.add_loader({[&] { return loader; }, [&](const accel::data::LoaderState& s) { loader = s; }});
  ck.save(ckpt, {0, 1, c10::Device(c10::kCPU), [] {}}, 3, false);
  for (const char* d : {"manifest", "process_record", "model_archive", "golden_json", "safetensors_index"})
    fs::create_directories(out / d);
  fs::copy_file(ckpt / "manifest.txt", out / "manifest" / "seed", fs::copy_options::overwrite_existing);
  fs::copy_file(ckpt / "model.pt", out / "model_archive" / "seed", fs::copy_options::overwrite_existing);
  // The process record's bytes, as process_0.pt holds them.
  torch::serialize::InputArchive a;
  a.load_from((ckpt / "process_0.pt").string());
  at::Tensor blob;
  a.read("record", blob);
  std::ofstream(out / "process_record" / "seed", std::ios::binary)
      .write(reinterpret_cast<const char*>(blob.data_ptr<std::uint8_t>()), std::streamsize(blob.numel()));
  // A golden file of the first three cases of a reference file.
  std::ifstream in(golden / "skip_first_batches.json");
  const auto ref = nlohmann::json::parse(in);
  nlohmann::json seed{{"meta", nlohmann::json::object()}, {"cases", nlohmann::json::array()}};
  for (std::size_t i = 0; i < 3; ++i) seed["cases"].push_back(ref.at("cases").at(i));
  std::ofstream(out / "golden_json" / "seed") << seed.dump() << "\n";
  // The index of a sharded save of the model (the target writes the same shards).
  accel::checkpoint::save_safetensors_sharded(accel::checkpoint::model_state(*model), ckpt / "shards",
                                              {.max_shard_size = 64});
  fs::copy_file(ckpt / "shards" / accel::checkpoint::safe_weights_index_name, out / "safetensors_index" / "seed",
                fs::copy_options::overwrite_existing);
  fs::remove_all(ckpt);
  std::cout << "seeds written under " << out << "\n";
  return 0;
}
