// Dispatched loading (pipeline/transport.hpp, loading::dispatched) on real processes.
#include "../harness.hpp"

#include <accel/accelerator.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/data/loader.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include <numeric>
#include <string>
#include <tuple>
#include <vector>

namespace mp {

// A batch with a non-tensor field, for dispatched loading with a slice function.
struct Named {
  at::Tensor x;
  std::vector<std::string> names;
};
auto accel_fields(Named& n) { return std::tie(n.x, n.names); }
auto accel_fields(const Named& n) { return std::tie(n.x, n.names); }

// Dispatched loading's transport and errors: every rank receives only its slice (<= 1/N of a broadcast of the
// global batch), and a batch that rank 0 cannot build stops every rank with the same message.
void dispatch(const Args&) {
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  using Dispatch = accel::CheckedConfig<accel::dist::gloo, accel::loading::dispatched>;
  accel::data::DataLoader dl(accel::data::TensorDataset(at::rand({4096, 32}), at::arange(4096)),
                             {.batch_size = 64, .shuffle = true});
  auto loader = accel::data::prepare_data_loader<Dispatch>(dl, state);
  std::int64_t rows = 0;
  for (const auto& b : loader) {
    (void)b;
    rows += accel::GradientState::instance().layout().real[std::size_t(tally.rank)];  // padding rows excluded
  }
  const auto [received, broadcast] = loader.transport_bytes();
  const double ratio = double(received) / double(broadcast);
  check(ratio <= 1.0 / N + 1e-9, "dispatched loading receives at most 1/N of a broadcast");
  check(accel::reduce(state.comm(), at::scalar_tensor(rows, at::kLong), accel::Reduction::sum).item<std::int64_t>() ==
            4096,
        "the ranks' rows add up to the dataset");
  state.print("dispatch transport: rank 0 received ", received, " bytes, a broadcast of every global batch would send ",
              broadcast, " (ratio ", ratio, " for ", N, " processes)");
  // scatter_object: any serialisable value per rank, tensors included.
  std::vector<std::tuple<std::string, at::Tensor>> parts;
  for (int q = 0; q < N; ++q) parts.emplace_back(std::string(std::size_t(q + 1), 'x'), at::full({q + 1}, q, at::kLong));
  auto got = accel::scatter_object(state.comm(), parts, 0);
  check(std::get<0>(got) == std::string(std::size_t(tally.rank + 1), 'x') &&
            at::equal(std::get<1>(got), at::full({tally.rank + 1}, tally.rank, at::kLong)),
        "scatter_object");
  // A slice function: batches with strings, cut by rank 0 and sent to each rank serialised.
  auto collate_named = [](const std::vector<std::int64_t>& ids) {
    Named n{at::tensor(ids, at::kLong), {}};
    for (auto i : ids) n.names.push_back("sample-" + std::to_string(i));
    return n;
  };
  auto slice = [](const Named& g, std::int64_t begin, std::int64_t size) {
    return Named{g.x.narrow(0, begin, size),
                 std::vector<std::string>(g.names.begin() + begin, g.names.begin() + begin + size)};
  };
  std::vector<std::int64_t> ids(26);
  std::iota(ids.begin(), ids.end(), 0);
  accel::data::DataLoader named(accel::data::RangeDataset<std::vector<std::int64_t>>(ids), {.batch_size = 4},
                                collate_named);
  auto nl = accel::data::prepare_data_loader<Dispatch>(named, state, slice);
  bool consistent = true;
  std::int64_t real_rows = 0;
  for (const auto& b : nl) {
    consistent &= std::int64_t(b.names.size()) == b.x.size(0);
    for (std::int64_t i = 0; i < b.x.size(0); ++i)
      consistent &= b.names[std::size_t(i)] == "sample-" + std::to_string(b.x[i].item<std::int64_t>());
    real_rows += accel::GradientState::instance().layout().real[std::size_t(tally.rank)];
  }
  check(consistent, "a slice function sends every rank its rows and their names");
  check(accel::reduce(state.comm(), at::scalar_tensor(real_rows, at::kLong), accel::Reduction::sum)
                .item<std::int64_t>() == 26,
        "with a slice function the real rows still add up to the dataset");
  struct Ragged {
    std::int64_t size() const { return 64; }
    at::Tensor get(std::int64_t i) const { return at::arange(i < 40 ? 3 : 4); }
  };
  accel::data::DataLoader bad(Ragged{}, {.batch_size = 8});
  auto bl = accel::data::prepare_data_loader<Dispatch>(bad, state);
  std::string message;
  try {
    for (const auto& b : bl) (void)b;
  } catch (const accel::Error& e) {
    message = e.what();
  }
  const std::string step = std::to_string(40 / (8 * N));  // the step whose samples change size
  check(message.find("loading batch " + step + " of epoch 0") != std::string::npos &&
            message.find("failed: stack expects each tensor to be equal size") != std::string::npos,
        "a batch rank 0 cannot collate stops every rank with its message (got: " + message + ")");

  // One message per step (Note [One message per step]): batches whose trailing shape changes from step to step,
  // growing past the message's capacity and shrinking again, over 3 epochs; every row holds its sample's id.
  const auto ragged_collate = [](const std::vector<std::int64_t>& batch) {
    const std::int64_t width = 1 + (batch.front() * 7) % 23;  // the step's width: up and down
    at::Tensor x = at::zeros({std::int64_t(batch.size()), width}, at::kLong);
    for (std::size_t i = 0; i < batch.size(); ++i) x[std::int64_t(i)].fill_(batch[i]);
    return torch::data::Example<>{x, at::tensor(batch, at::kLong)};
  };
  accel::data::DataLoader widths(accel::data::RangeDataset<std::vector<std::int64_t>>(ids), {.batch_size = 3},
                                 ragged_collate);
  auto wl = accel::data::prepare_data_loader<Dispatch>(widths, state);
  bool rows_right = true;
  std::int64_t id_sum = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (const auto& b : wl) {
      rows_right &= b.data.size(0) == b.target.size(0) && b.data.dim() == 2 && b.data.size(1) >= 1;
      for (std::int64_t i = 0; i < b.data.size(0); ++i)
        rows_right &= at::equal(b.data[i], at::full({b.data.size(1)}, b.target[i].item<std::int64_t>(), at::kLong));
      const std::int64_t real = accel::GradientState::instance().layout().real[std::size_t(tally.rank)];
      for (std::int64_t i = 0; i < real; ++i) id_sum += b.target[i].item<std::int64_t>();
    }
  }
  check(rows_right, "dispatched batches whose width changes every step: every rank's rows hold their ids");
  check(accel::reduce(state.comm(), at::scalar_tensor(id_sum, at::kLong), accel::Reduction::sum).item<std::int64_t>() ==
            3 * 325,
        "dispatched batches whose width changes every step: the real rows are every sample once per epoch");
  // A leaf with no first dimension cannot be cut: every rank stops with rank 0's message (not rank 0 alone).
  accel::data::DataLoader scalar(accel::data::RangeDataset<std::vector<std::int64_t>>(ids), {.batch_size = 2},
                                 [](const std::vector<std::int64_t>& batch) {
                                   return torch::data::Example<>{at::tensor(batch, at::kLong), at::scalar_tensor(1.0)};
                                 });
  message.clear();
  try {
    for (const auto& b : accel::data::prepare_data_loader<Dispatch>(scalar, state)) (void)b;
  } catch (const accel::Error& e) {
    message = e.what();
  }
  check(message.find("a leaf has none (a 0-d tensor)") != std::string::npos,
        "a batch with a 0-d tensor stops every rank with rank 0's message (got: " + message + ")");
}

}  // namespace mp
