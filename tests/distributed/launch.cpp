// accel-launch (tools/accel_launch.cpp) with real training: one job on several nodes equals the same processes on one
// node, a job restarted after a SIGKILL (--max-restarts) resumes from its latest checkpoint and ends with the
// parameters of an uninterrupted run, and a job asked to stop by a signal (Options::preemption) saves at a step
// boundary on every rank and, restarted, ends with them too. tests/distributed/launch.sh and preemption.sh start
// the launchers and compare the checksums.
#include "harness.hpp"

#include <accel/accelerator.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <thread>
#include <tuple>

namespace mp {

namespace {
struct Elastic : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::even,
                                    accel::loading::sharded, accel::rng::sync<accel::rng::generator>> {};

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// FNV-1a over every parameter's bytes: equal checksums are bit-identical parameters.
std::string checksum(const torch::nn::Module& net) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : net.parameters()) {
    const auto t = p.detach().cpu().contiguous();
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}

// The job both training modes run: a small MLP on fixed random data, SGD with momentum, StepLR, a shuffled loader
// of 96 samples in batches of 4. Returns the module and the prepared model, optimizer, loader and scheduler.
auto prepare_job(Elastic& acc) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({96, 5}), y = at::randn({96, 2});
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 16), torch::nn::Tanh(), torch::nn::Dropout(0.1),
                                   torch::nn::Linear(16, 2));
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt, loader, sched] = acc.prepare(
      net, sgd, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = 4, .shuffle = true}),
      std::make_shared<torch::optim::StepLR>(*sgd, 5, 0.5));
  return std::tuple(net, model, opt, loader, sched);
}
template <class Model, class Opt, class Sched, class Batch>
void train_step(Elastic& acc, Model& model, Opt& opt, Sched& sched, const Batch& b) {
  auto step = acc.accumulate(model);
  acc.backward(torch::mse_loss(model(b.data), b.target));
  opt.step();
  sched.step();
  opt.zero_grad();
}

// "R:S[:G]": rank R SIGKILLs itself before its batch S (counted over the whole run) in generations below G (1).
struct Kill {
  int rank = -1, batch = -1, below_generation = 1;
};
Kill parse_kill(const std::string& s) {
  Kill k;
  if (s.empty()) return k;
  char colon = 0;
  std::istringstream is(s);
  is >> k.rank >> colon >> k.batch;
  if (is >> colon) is >> k.below_generation;
  return k;
}
}  // namespace

// elastic DIR [EPOCHS] [EVERY] [KILL]: trains with a checkpoint in DIR every EVERY batches, resuming from DIR when it
// exists (as a restarted job does); prints when its rendezvous completed and, on rank 0, the parameters' checksum.
void elastic(const Args& args) {
  const std::filesystem::path dir = arg(args, 0, "");
  const int epochs = std::stoi(arg(args, 1, "3")), every = std::stoi(arg(args, 2, "4"));
  const Kill kill = parse_kill(arg(args, 3, ""));
  accel::detail::require(!dir.empty(), "elastic: give a checkpoint directory");
  Elastic acc{accel::Options{.seed = 42, .gradient_accumulation_steps = 2, .comm = options(30000).comm}};
  tally.rank = acc.process_index();
  const int generation = acc.state().restart_count();
  std::cout << "elastic: rank " << tally.rank << " generation " << generation << " rendezvous at " << now_ms() << " ms"
            << std::endl;

  auto [net, model, opt, loader, sched] = prepare_job(acc);
  const std::int64_t per_epoch = loader.size();  // before a resume: then size() counts the batches left in its epoch
  const bool resumed = std::filesystem::exists(dir);
  if (resumed) acc.load_state(dir);
  check(generation > 0 || !resumed, "a first attempt starts from scratch (the test removes the checkpoint first)");
  std::int64_t done = 0;  // batches of the whole run, this one's and those before the checkpoint
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    if (done == 0) {  // the loader's position in a resumed epoch is known once its epoch is set
      done = epoch * per_epoch + loader.state_dict().batches;
      acc.print("elastic: generation ", generation, ", ", acc.num_processes(), " processes, ",
                resumed ? "resumed after batch " + std::to_string(done) : std::string("from the start"));
    }
    for (const auto& b : loader) {
      if (tally.rank == kill.rank && done == kill.batch && generation < kill.below_generation) {
        std::cout << "elastic: rank " << tally.rank << " kills itself at " << now_ms() << " ms, before batch " << done
                  << " (generation " << generation << ")" << std::endl;
        std::raise(SIGKILL);
      }
      train_step(acc, model, opt, sched, b);
      if (++done % every == 0) acc.save_state(dir);
    }
  }
  acc.print("elastic: parameter checksum ", checksum(*net), " after ", done, " batches");
  acc.wait_for_everyone();
}

// preemptible PROJECT [EPOCHS] [PACE_MS] [R:S:SIGNAL]: the elastic job's training under a checkpoint policy
// (Options::project_config, automatic naming, total_limit 2) with Options::preemption: it resumes from the project's
// latest checkpoint when there is one, counts its batches in a registered custom state, sleeps PACE_MS after each
// batch (so that a signal from outside lands mid-run), and rank R raises SIGNAL itself after batch S (counted over
// the whole run). Prints "preemptible: training" once it trains and, at the end, rank 0's parameter checksum.
void preemptible(const Args& args) {
  const std::filesystem::path project = arg(args, 0, "");
  const int epochs = std::stoi(arg(args, 1, "3")), pace_ms = std::stoi(arg(args, 2, "0"));
  const Kill self = parse_kill(arg(args, 3, ""));  // R:S:SIGNAL (the third field is the signal here)
  accel::detail::require(!project.empty(), "preemptible: give a project directory");
  Elastic acc{
      accel::Options{.seed = 42,
                     .gradient_accumulation_steps = 2,
                     .comm = options(30000).comm,
                     .project_config = {.project_dir = project, .automatic_checkpoint_naming = true, .total_limit = 2},
                     .preemption = {.enabled = true}}};
  tally.rank = acc.process_index();
  auto [net, model, opt, loader, sched] = prepare_job(acc);
  std::int64_t done = 0;  // batches of the whole run: custom state, restored by load_state
  acc.register_for_checkpointing(done);
  if (const auto latest = acc.latest_checkpoint()) {
    acc.load_state();
    acc.print("preemptible: resumed from ", latest->filename().string(), " after batch ", done);
  }
  acc.print("preemptible: training");
  for (std::int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    for (const auto& b : loader) {
      train_step(acc, model, opt, sched, b);
      ++done;
      if (tally.rank == self.rank && done == self.batch) {
        std::cout << "preemptible: rank " << tally.rank << " raises signal " << self.below_generation << " after batch "
                  << done << std::endl;
        std::raise(self.below_generation);
      }
      if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
    }
  }
  acc.print("preemptible: parameter checksum ", checksum(*net), " after ", done, " batches");
  acc.wait_for_everyone();
}

}  // namespace mp
