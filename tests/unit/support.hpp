#pragma once
// Helpers shared by the unit tests (one header, so that the unity TUs that merge several test files see one
// definition of each).
#include "../support/policy_matrix.hpp"
#include "../support/samples.hpp"

#include <accel/data/loader.hpp>
#include <accel/state/gradient_state.hpp>

#include <ATen/core/Tensor.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace accel_test {

//! What `out` holds, read back through its bytes (as a checkpoint file carries it).
inline torch::serialize::InputArchive reread(torch::serialize::OutputArchive& out) {
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  return in;
}
//! `in`'s values with the one of `key` replaced by `value` (a file from elsewhere), as an archive to save.
inline torch::serialize::OutputArchive with_value(torch::serialize::InputArchive& in, const std::string& key,
                                                  const c10::IValue& value) {
  torch::serialize::OutputArchive out;
  for (const auto& k : in.keys()) {
    c10::IValue v;
    in.read(k, v);
    out.write(k, k == key ? value : v);
  }
  return out;
}

//! A JSON file of tests/golden/data (vectors produced by Python Accelerate).
inline nlohmann::json golden(const std::string& name) {
  const std::string path = std::string(ACCEL_TEST_DATA_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing test data " + path);
  return nlohmann::json::parse(in);
}

using Indices = accel::data::RangeDataset<std::vector<std::int64_t>>;

inline Batches as_batches(const nlohmann::json& j) { return j.get<Batches>(); }

//! The dataset 0, 1, ..., n-1: a batch is the tensor of its indices.
inline Indices indices(std::int64_t n) { return Indices(iota_vector(n)); }

//! One epoch of a prepared loader: its batches and GradientState's end_of_dataloader after each.
template <class Loader>
std::pair<Batches, std::vector<bool>> run_epoch(Loader& loader) {
  Batches out;
  std::vector<bool> ends;
  for (const auto& b : loader) {
    out.push_back(as_vector(b));
    ends.push_back(accel::GradientState::instance().end_of_dataloader());
  }
  return {out, ends};
}

//! The configuration most tests need: Accelerate's defaults on the Gloo engine (tests of every combination run over
//! the policy matrix of tests/support/policy_matrix.hpp).
using Even = accel::CheckedConfig<accel::dist::gloo>;
//! split_batches: for the tests of its own refusals.
using Split = accel::CheckedConfig<accel::dist::gloo, accel::batches::split>;

}  // namespace accel_test

// ---- plans ------------------------------------------------------------------------------------------------
#include <accel/pipeline/plan_view.hpp>
#include <accel/plan/plan.hpp>

#include <random>

namespace accel_test {

//! The batches of a plan over an order (sequential by default), as index lists.
inline Batches batches_of(const accel::plan::BatchPlan& p, const accel::data::IndexOrder& order) {
  Batches out;
  for (const auto& b : accel::pipeline::planned_batches(p, order)) {
    std::vector<std::int64_t> v;
    b.indices_into(v);
    out.push_back(std::move(v));
  }
  return out;
}
inline Batches batches_of(const accel::plan::BatchPlan& p) {
  return batches_of(p, accel::data::IndexOrder::sequential(p.samples()));
}

//! Every index of one process's epoch, with the number of real (not padding) samples of each batch.
struct Yield {
  Batches batches;
  std::vector<std::int64_t> real;
};
inline Yield yield_of(const accel::plan::BatchPlan& p) {
  Yield y;
  for (std::int64_t j = 0; j < p.size(); ++j) {
    const auto s = p.span(j);
    std::vector<std::int64_t> v;
    for (auto pos = s.begin; pos < s.end; ++pos) v.push_back(p.sample(pos));
    y.batches.push_back(std::move(v));
    y.real.push_back(p.real(j));
  }
  return y;
}

//! A random valid ShardSpec for process 0: small (N <= 5, B <= 7) or large (N <= 64, B <= 100).
inline accel::plan::ShardSpec random_spec(std::mt19937_64& rng, bool small) {
  const int N = small ? int(rng() % 5) + 1 : int(rng() % 64) + 1;
  std::int64_t B = small ? std::int64_t(rng() % 7) + 1 : std::int64_t(rng() % 100) + 1;
  const bool split = rng() % 3 == 0;
  if (split) B = N * (std::int64_t(rng() % (small ? 3 : 8)) + 1);
  return {.batch_size = B,
          .drop_last = rng() % 3 == 0,
          .num_processes = N,
          .process_index = 0,
          .split_batches = split,
          .even_batches = rng() % 2 == 0};
}

}  // namespace accel_test
