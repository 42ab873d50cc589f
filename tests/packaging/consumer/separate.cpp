// The same installed accel in ACCEL_SEPARATE_COMPILATION: this file sees only declarations of the safetensors
// JSON code, the trackers' writers and the engines; accel_add_separate_library compiled them once.
#include <accel/accel.hpp>

#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("accel_consumer_separate_" + std::to_string(::getpid()));
  torch::nn::Linear net(3, 2), other(3, 2);
  accel::checkpoint::save_model(*net, dir / "model");
  accel::checkpoint::load_model(*other, dir / "model");
  const bool same = torch::equal(net->weight, other->weight) && torch::equal(net->bias, other->bias);
  {
    accel::tracking::Trackers run({accel::tracking::Tracker::jsonl}, dir / "run", {{"lr", 0.1}});
    run.log({{"loss", 0.5}}, 0);
  }
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::string line;
  std::getline(metrics, line);
  std::filesystem::remove_all(dir);
  if (!same || line != R"({"step":0,"loss":0.5})") {
    std::cerr << "separate compilation: FAILED (weights equal: " << same << ", metrics line: " << line << ")\n";
    return 1;
  }
  std::cout << "separate compilation: model saved and loaded back, tracker written\n";
  return 0;
}
