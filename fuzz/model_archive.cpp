// libFuzzer target: a LibTorch archive as a checkpoint's model.pt is read (accel/checkpoint/archive.hpp: the zip
// and pickle checks, then LibTorch's reader, the layout check, then Module::load). The seeds' zip CRCs hold, but libFuzzer's
// mutations break them; run it with -use_value_profile=1 or start from a corpus of many valid archives.
#include "common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static auto model = readers::small_model();
  return accel_fuzz::run(data, size, [](readers::Bytes b) { readers::model(b, "model.pt", *model); });
}
