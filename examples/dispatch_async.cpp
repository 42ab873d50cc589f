// The second example: dispatched loading and asynchronous placement.
//
//   build/tools/accel-launch --nproc-per-node 2 build/examples/dispatch_async --data examples/data/digits.csv
//
// Only rank 0 reads the data (think of a dataset on one machine's disk, or a stream that cannot be split):
// `loading::dispatched` has rank 0 collate each global batch and scatter every process its slice, so each process
// receives 1/N of what Accelerate's broadcast would send it. `place::async` moves the slices to the process's GPU
// from the loader's worker threads (pinned staging, a side stream, an event hand-off), so the copy of the next
// batch overlaps the compute on this one; on a CPU-only machine the batches stay where they are. The model is
// trained with the same Accelerator loop as the main example and evaluated with gather_for_metrics.
#include "digits.hpp"

#include <accel/accel.hpp>

#include <ATen/ops/argmax.h>
#include <ATen/ops/eq.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <CLI/CLI.hpp>

#include <iomanip>

#if ACCEL_WITH_CUDA
using Placement = accel::place::async;  // pinned staging and a copy stream when the process has a GPU
#else
using Placement = accel::place::device;  // a build without CUDA has no asynchronous copies to make
#endif
struct Acc : accel::Accelerator<accel::dist::from_env, accel::loading::dispatched, Placement> {};

int main(int argc, char** argv) try {
  CLI::App cli{"accel example: dispatched loading (rank 0 reads) with asynchronous placement"};
  std::string data = "examples/data/digits.csv";
  int epochs = 10;
  cli.add_option("--data", data, "the digits CSV (64 pixels and a label per row)");
  cli.add_option("--epochs", epochs, "training epochs")->check(CLI::PositiveNumber);
  CLI11_PARSE(cli, argc, argv);

  Acc acc{accel::Options{.seed = 7}};
  const auto [x, y] = examples::read_digits(data);
  const std::int64_t n_test = 297, n_train = x.size(0) - n_test;
  auto net = torch::nn::Sequential(torch::nn::Linear(64, 96), torch::nn::ReLU(), torch::nn::Linear(96, 10));
  auto [model, opt, train, test] = acc.prepare(
      net, torch::optim::Adam(net->parameters(), torch::optim::AdamOptions(3e-3)),
      accel::data::DataLoader(accel::data::TensorDataset(x.narrow(0, 0, n_train), y.narrow(0, 0, n_train)),
                              {.batch_size = 64, .shuffle = true, .workers = 2, .prefetch = 2}),
      accel::data::DataLoader(accel::data::TensorDataset(x.narrow(0, n_train, n_test), y.narrow(0, n_train, n_test)),
                              {.batch_size = 64}));
  acc.print("dispatched loading on ", acc.num_processes(), " process(es), device ", acc.device(),
            ": rank 0 reads batches of ", train.total_batch_size(), " and scatters ",
            train.total_batch_size() / acc.num_processes(), " rows to each process");

  for (int epoch = 0; epoch < epochs; ++epoch) {
    train.set_epoch(epoch);
    double loss_sum = 0;
    std::int64_t batches = 0;
    for (const auto& batch : train) {
      auto step = acc.accumulate(model);
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      loss_sum += loss.item<double>();
      ++batches;
    }
    acc.print("epoch ", epoch, "  loss ", std::fixed, std::setprecision(4),
              acc.reduce(at::scalar_tensor(loss_sum / double(batches)), accel::Reduction::mean).item<double>());
  }
  const auto [received, broadcast] = train.transport_bytes();
  acc.print("this process received ", received,
            " bytes of batches; a broadcast of every global batch (Accelerate's "
            "transport) would have sent it ",
            broadcast, " (", std::setprecision(3), double(received) / double(std::max<std::int64_t>(broadcast, 1)),
            "x)");

  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, seen = 0;
  for (const auto& batch : test) {
    const auto hits = acc.gather_for_metrics(at::eq(at::argmax(model(batch.data), 1), batch.target).to(at::kLong));
    correct += hits.sum().item<std::int64_t>();
    seen += hits.size(0);
  }
  acc.print("held-out accuracy ", std::fixed, std::setprecision(2), 100.0 * double(correct) / double(seen), "% over ",
            seen, " samples");
  acc.wait_for_everyone();
  return seen == n_test ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
