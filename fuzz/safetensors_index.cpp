// libFuzzer target: a sharded safetensors checkpoint's index (model.safetensors.index.json), read with its shards by
// load_safetensors_sharded (accel/checkpoint/safetensors.hpp: the index's checks, then every shard's header). The
// shards are a fixed valid save, written once into a scratch directory; the input replaces the index.
#include "common.hpp"

#include <unistd.h>

#include <filesystem>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto dir = [] {
    const auto d = std::filesystem::temp_directory_path() / ("accel_fuzz_index_" + std::to_string(::getpid()));
    auto model = readers::small_model();
    accel::checkpoint::save_safetensors_sharded(accel::checkpoint::model_state(*model), d, {.max_shard_size = 64});
    return d;
  }();
  return accel_fuzz::run(data, size, [](readers::Bytes b) {
    (void)readers::safetensors_dir(b, dir, accel::checkpoint::safe_weights_index_name);
  });
}
