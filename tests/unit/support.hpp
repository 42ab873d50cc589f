#pragma once
// Helpers shared by the unit tests.
#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>
#include <string>

namespace accel_test {

//! A JSON file of tests/golden/data (vectors produced by Python Accelerate).
inline nlohmann::json golden(const std::string& name) {
  const std::string path = std::string(ACCEL_TEST_DATA_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing test data " + path);
  return nlohmann::json::parse(in);
}

}  // namespace accel_test
