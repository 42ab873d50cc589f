// The main example: a real multi-process training run on data that ships with the project.
//
//   build/tools/accel-launch --nproc-per-node 2 build/examples/train examples/data/digits.csv
//
// A small MLP learns the UCI handwritten digits (1,797 8x8 images; the last 297 are held out). Every process
// reads only its shard of each shuffled epoch; gradients are averaged across processes by DistributedModule
// (bucketed all-reduce overlapping backward); the optimizer and scheduler step only when gradients are
// synchronised. The held-out accuracy is computed with gather_for_metrics over exactly the 297 test samples
// (the padding that evens out the last batch is dropped). Logs appear on the main process only.
#include <accel/accel.hpp>

#include <ATen/ops/argmax.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/from_blob.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <sstream>

struct Acc : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::even,
                                accel::loading::sharded, accel::rng::sync<accel::rng::generator>, accel::place::device> {};

namespace {
std::pair<at::Tensor, at::Tensor> read_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw accel::InvalidArgument("train: cannot read " + path + " (run from the repository root, or pass the path)");
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  for (std::string line; std::getline(in, line);) {
    std::stringstream row(line);
    std::vector<float> values;
    for (std::string cell; std::getline(row, cell, ',');) values.push_back(std::stof(cell));
    if (values.size() != 65) throw accel::InvalidArgument("train: " + path + ": a row has " + std::to_string(values.size()) + " values, not 65");
    pixels.insert(pixels.end(), values.begin(), values.end() - 1);
    labels.push_back(std::int64_t(values.back()));
  }
  const auto n = std::int64_t(labels.size());
  auto x = at::from_blob(pixels.data(), {n, 64}, at::kFloat).clone() / 16.0;
  auto y = at::from_blob(labels.data(), {n}, at::kLong).clone();
  return {x, y};
}
}  // namespace

int main(int argc, char** argv) try {
  accel::ProcessState state;
  const auto [x, y] = read_digits(argc > 1 ? argv[1] : "examples/data/digits.csv");
  const std::int64_t n_test = 297, n_train = x.size(0) - n_test;
  accel::set_seed(42);

  auto net = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10)).ptr();
  net->to(state.device());
  accel::DistributedModule model(net, state.comm());
  auto adam = std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(3e-3));
  accel::AcceleratedOptimizer<torch::optim::Adam> opt(adam);
  using Sched = accel::AcceleratedScheduler<torch::optim::StepLR, torch::optim::Adam>;
  Sched sched(std::make_shared<torch::optim::StepLR>(*adam, 400, 0.5), {&opt}, Sched::Options{.num_processes = state.num_processes()});
  accel::Accumulation accumulation({.steps = 1});

  accel::data::DataLoader train_dl(accel::data::TensorDataset(x.narrow(0, 0, n_train), y.narrow(0, 0, n_train)),
                                   {.batch_size = 32, .shuffle = true});
  accel::data::DataLoader test_dl(accel::data::TensorDataset(x.narrow(0, n_train, n_test), y.narrow(0, n_train, n_test)),
                                  {.batch_size = 64});
  auto train = accel::data::prepare_data_loader<Acc::config>(train_dl, state);
  auto test = accel::data::prepare_data_loader<Acc::config>(test_dl, state);
  state.print("training on ", state.num_processes(), " process(es), ", train.size(), " batches of 32 per process per epoch, ",
              train.total_batch_size(), " samples per optimizer step");

  const auto t0 = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < 15; ++epoch) {
    train.set_epoch(epoch);
    double loss_sum = 0;
    std::int64_t batches = 0;
    for (const auto& batch : train) {
      accumulation.begin_step();
      auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
      (loss / accumulation.steps()).backward();
      opt.step();
      sched.step();
      opt.zero_grad();
      loss_sum += loss.item<double>();
      ++batches;
    }
    const double mean_loss = accel::reduce(state.comm(), at::scalar_tensor(loss_sum / double(batches)), accel::Reduction::mean).item<double>();
    state.print("epoch ", epoch, "  loss ", std::fixed, std::setprecision(4), mean_loss);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Evaluation: every rank predicts its shard; gather_for_metrics drops the padding of the even tail.
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, seen = 0;
  for (const auto& batch : test) {
    const auto hits = at::eq(at::argmax(net->forward(batch.data), 1), batch.target).to(at::kLong);
    const auto all = accel::gather_for_metrics(state.comm(), hits, accel::GradientState::instance().layout());
    correct += all.sum().item<std::int64_t>();
    seen += all.size(0);
  }
  state.print("held-out accuracy ", std::fixed, std::setprecision(2), 100.0 * double(correct) / double(seen), "% over ", seen,
              " samples (the test set has ", n_test, "); training took ", std::setprecision(2), seconds, " s");
  state.wait_for_everyone();
  return seen == n_test ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
