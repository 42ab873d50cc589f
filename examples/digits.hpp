#pragma once
// The UCI handwritten digits shipped in examples/data (CC BY 4.0, see examples/data/README.md): 1,797 rows of
// 64 pixel values (0-16) and a label (0-9). Shared by the examples.
#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace examples {

//! (pixels scaled to [0, 1] as an n x 64 float tensor, labels as n longs).
inline std::pair<at::Tensor, at::Tensor> read_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw accel::InvalidArgument("cannot read " + path + " (run from the repository root, or pass --data)");
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  for (std::string line; std::getline(in, line);) {
    std::stringstream row(line);
    std::vector<float> values;
    for (std::string cell; std::getline(row, cell, ',');) values.push_back(std::stof(cell));
    if (values.size() != 65)
      throw accel::InvalidArgument(path + ": a row has " + std::to_string(values.size()) + " values, not 65");
    pixels.insert(pixels.end(), values.begin(), values.end() - 1);
    labels.push_back(std::int64_t(values.back()));
  }
  const auto n = std::int64_t(labels.size());
  auto x = at::from_blob(pixels.data(), {n, 64}, at::kFloat).clone().div_(16.0);
  auto y = at::from_blob(labels.data(), {n}, at::kLong).clone();
  return {x, y};
}

}  // namespace examples
