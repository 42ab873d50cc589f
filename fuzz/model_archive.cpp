// libFuzzer target: a LibTorch archive as a checkpoint's model.pt is read (accel/checkpoint/archive.hpp: the zip
// and pickle checks, then LibTorch's reader, then Module::load). The seeds' zip CRCs hold, but libFuzzer's
// mutations break them; run it with -use_value_profile=1 or start from a corpus of many valid archives.
#include "common.hpp"

#include <accel/checkpoint/archive.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static auto model = accel_fuzz::small_model();
  return accel_fuzz::run(data, size, [](std::span<const std::uint8_t> b) {
    torch::serialize::InputArchive a;
    accel::checkpoint::load_archive(a, b, "model.pt");
    accel::checkpoint::reading("model.pt", [&] { model->load(a); });
  });
}
