// The main example: a real multi-process training run on data that ships with the project.
//
//   build/tools/accel-launch --nproc-per-node 2 build/examples/train --data examples/data/digits.csv
//   ... --project-dir run --stop-after 200     # save a checkpoint after 200 batches and stop (an interruption)
//   ... --project-dir run --resume             # continue from the latest one; ends exactly where an uninterrupted run
//   ends
//   (--resume also works with another --nproc-per-node: the epoch goes on over the samples not yet seen)
//   ... --project-dir run --checkpoint-every 50 --resume-if-any   # under accel-launch --max-restarts 3: every
//                                            # attempt goes on from the latest checkpoint, the first one from the start
//
// With --project-dir, the job keeps its files under that folder (accel::ProjectConfiguration): checkpoints in
// checkpoints/checkpoint_<n> (one every --checkpoint-every batches, the 2 latest kept), the metrics of every epoch
// in digits/ (JSONL, and TensorBoard event files). SIGTERM or SIGUSR1 (a cluster preempting the job: SLURM's
// --signal=USR1@60) saves a checkpoint at the next step boundary on every process and exits; --resume goes on.
//
// A small MLP learns the UCI handwritten digits (1,797 8x8 images; the last 297 are held out). `prepare` shards
// every shuffled epoch across the processes, wraps the model so that gradients are averaged (bucketed all-reduce
// overlapping backward), and wraps the optimizer and scheduler so that they step only when gradients are
// synchronised (2-step gradient accumulation here); the learning rate warms up linearly over the first 30 optimizer
// steps, then decays linearly to zero (transformers' linear schedule with warmup, exactly). The held-out accuracy is
// computed with gather_for_metrics over exactly the 297 test samples (the padding that evens out the last batch is
// dropped). Logs and the progress bar appear on the main process only. The parameter checksum printed at the end
// identifies the trained weights.
#include "digits.hpp"

#include <accel/accel.hpp>

#include <ATen/ops/argmax.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/from_blob.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <tuple>
#include <vector>

struct Acc
    : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::even, accel::loading::sharded,
                         accel::rng::sync<accel::rng::generator>, accel::place::device> {};

namespace {
//! A one-line progress bar on the main process, redrawn in place on a terminal (logs get the epoch lines only).
class Progress {
 public:
  Progress(const Acc& acc, std::int64_t total) : show_(acc.is_local_main_process()), tty_(::isatty(2)), total_(total) {}
  void update(std::int64_t done, int epoch, double loss) const {
    if (!show_ || !tty_) return;
    const int width = 30, filled = int(width * done / std::max<std::int64_t>(total_, 1));
    std::fprintf(stderr, "\repoch %2d [%s%s] %3lld/%lld  loss %.4f%s", epoch, std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                 loss, done == total_ ? "\n" : "");
  }

 private:
  bool show_, tty_;
  std::int64_t total_;
};

// An epoch's loss so far: each process sums its own batches' losses. Before every checkpoint (a save_state pre-hook,
// which every process runs, the preemption save included) every process's sums are gathered into `saved`, which the
// checkpoint holds (register_for_checkpointing), so that a resumed epoch goes on from them and logs the mean over all
// its batches, as an uninterrupted one does.
struct EpochLoss {
  std::int64_t epoch = -1;
  double sum = 0;             // this process's losses
  std::int64_t batches = 0;   // and how many
  std::vector<double> saved;  // every process's {sum, batches} at the last checkpoint, by rank
  // A resumed epoch: this process's sums from the checkpoint (at another number of processes, process 0 takes
  // them all).
  void resume(int rank, int processes) {
    const auto saving = std::int64_t(saved.size() / 2);
    sum = 0;
    batches = 0;
    for (std::int64_t r = 0; r < saving; ++r)
      if (saving == processes ? r == rank : rank == 0) {
        sum += saved[std::size_t(2 * r)];
        batches += std::int64_t(saved[std::size_t(2 * r + 1)]);
      }
    saved.clear();
  }
};
auto accel_fields(EpochLoss& l) { return std::tie(l.epoch, l.sum, l.batches, l.saved); }
auto accel_fields(const EpochLoss& l) { return std::tie(l.epoch, l.sum, l.batches, l.saved); }

std::string checksum(const torch::nn::Module& net) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes
  for (const auto& p : net.parameters()) {
    const auto t = p.detach().cpu().contiguous();
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}
}  // namespace

int main(int argc, char** argv) try {
  CLI::App cli{"accel example: 2-process MLP training on the UCI handwritten digits"};
  std::string data = "examples/data/digits.csv", project_dir;
  int epochs = 15;
  std::int64_t stop_after = 0, checkpoint_every = 0;
  bool resume = false;
  cli.add_option("--data", data, "the digits CSV (64 pixels and a label per row)");
  cli.add_option("--epochs", epochs, "training epochs")->check(CLI::PositiveNumber);
  cli.add_option("--project-dir", project_dir,
                 "keep checkpoints (checkpoints/checkpoint_<n>) and metrics (digits/) here");
  cli.add_option("--checkpoint-every", checkpoint_every,
                 "save a checkpoint every this many batches (the 2 latest are kept)")
      ->needs("--project-dir")
      ->check(CLI::PositiveNumber);
  cli.add_option("--stop-after", stop_after, "save a checkpoint after this many batches and stop")
      ->needs("--project-dir");
  cli.add_flag("--resume", resume, "continue from the project's latest checkpoint")->needs("--project-dir");
  bool resume_if_any = false;  // what a job restarted by accel-launch --max-restarts needs
  cli.add_flag("--resume-if-any", resume_if_any,
               "continue from the project's latest checkpoint if it has one, else start "
               "from the beginning (for accel-launch --max-restarts)")
      ->needs("--project-dir")
      ->excludes("--resume");
  CLI11_PARSE(cli, argc, argv);

  const bool project = !project_dir.empty();
  Acc acc{accel::Options{
      .seed = 42,
      .gradient_accumulation_steps = 2,
      .log_with = project ? std::vector{accel::tracking::Tracker::jsonl, accel::tracking::Tracker::tensorboard}
                          : std::vector<accel::tracking::Tracker>{},
      .project_config = {.project_dir = project ? project_dir : ".",
                         .automatic_checkpoint_naming = project,
                         .total_limit = 2},
      .preemption = {.enabled = project}}};
  const auto [x, y] = examples::read_digits(data);
  const std::int64_t n_test = 297, n_train = x.size(0) - n_test;

  auto net = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(), torch::nn::Dropout(0.1),
                                   torch::nn::Linear(128, 10));
  auto adamw =
      std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-4));
  auto [model, opt, train, test] = acc.prepare(
      net, adamw,
      accel::data::DataLoader(accel::data::TensorDataset(x.narrow(0, 0, n_train), y.narrow(0, 0, n_train)),
                              {.batch_size = 16, .shuffle = true}),
      accel::data::DataLoader(accel::data::TensorDataset(x.narrow(0, n_train, n_test), y.narrow(0, n_train, n_test)),
                              {.batch_size = 64}));
  // The schedule counts scheduler steps: one per optimizer step and process (Accelerate's default), so its length
  // is the run's optimizer steps times the processes (acc.schedule_steps).
  const auto per_epoch = std::int64_t(train.size());  // (asked before a resume: then it counts what is left)
  const std::int64_t total_steps = acc.schedule_steps(per_epoch, epochs);
  auto sched = acc.prepare(accel::linear_schedule_with_warmup(
      *adamw, {.num_warmup_steps = 30 * acc.num_processes(), .num_training_steps = total_steps}));
  EpochLoss loss_so_far;
  acc.register_for_checkpointing(loss_so_far);
  acc.register_save_state_pre_hook([&](const std::filesystem::path&) {
    double mine[2] = {loss_so_far.sum, double(loss_so_far.batches)};
    const auto all = acc.gather(at::from_blob(mine, {2}, at::kDouble)).contiguous();
    loss_so_far.saved.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  });
  const auto latest = resume || resume_if_any ? acc.latest_checkpoint() : std::nullopt;
  if (resume && !latest)
    throw accel::InvalidArgument("--resume: no complete checkpoint under " + project_dir +
                                 "/checkpoints; run without --resume first");
  if (resume_if_any && !latest)
    acc.print("no checkpoint under ", project_dir, "/checkpoints yet: starting from the beginning");
  if (latest) {
    const auto saved = accel::checkpoint::describe(*latest);
    const auto t = std::chrono::steady_clock::now();
    acc.load_state();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    const auto at = train.state_dict();
    acc.print("resumed from ", latest->string(), ": epoch ", at.epoch, " at sample ", at.position, " of ", n_train,
              ", checkpoint of ", saved.num_processes, saved.num_processes == 1 ? " process" : " processes", ", now ",
              acc.num_processes(), " (loaded in ", std::fixed, std::setprecision(1), ms, " ms)");
  }
  if (project)
    acc.init_trackers("digits", {{"lr", 3e-3},
                                 {"batch_size", std::int64_t(16)},
                                 {"epochs", std::int64_t(epochs)},
                                 {"processes", std::int64_t(acc.num_processes())}});
  acc.print("training on ", acc.num_processes(), " process(es): ", train.size(),
            " batches of 16 per process per epoch, ", train.total_batch_size() * acc.gradient_accumulation_steps(),
            " samples per optimizer step");

  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t batches_done = 0;
  for (std::int64_t epoch = train.epoch(); epoch < epochs; ++epoch) {
    train.set_epoch(epoch);
    Progress bar(acc, train.size());
    if (loss_so_far.epoch == epoch)
      loss_so_far.resume(acc.process_index(), acc.num_processes());
    else
      loss_so_far = {.epoch = epoch};
    std::int64_t seen = train.state_dict().batches;  // > 0 in a resumed epoch
    for (const auto& batch : train) {
      auto step = acc.accumulate(model);
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      acc.backward(loss);
      opt.step();
      sched.step();
      opt.zero_grad();
      loss_so_far.sum += loss.item<double>();
      ++loss_so_far.batches;
      bar.update(++seen, int(epoch), loss_so_far.sum / double(loss_so_far.batches));
      if (++batches_done == stop_after) {
        const auto dir = acc.save_state();
        acc.print("checkpoint saved to ", dir.string(), " after ", stop_after,
                  " batches; stopping (resume with --resume)");
        return 0;
      }
      if (checkpoint_every > 0 && (epoch * per_epoch + seen) % checkpoint_every == 0) (void)acc.save_state();
    }
    double mine[2] = {loss_so_far.sum, double(loss_so_far.batches)};  // every process's losses over their number
    const auto total = acc.reduce(at::from_blob(mine, {2}, at::kDouble)).contiguous();
    const double mean_loss = total.data_ptr<double>()[0] / std::max(total.data_ptr<double>()[1], 1.0);
    const double lr = adamw->param_groups()[0].options().get_lr();
    acc.print("epoch ", epoch, "  loss ", std::fixed, std::setprecision(4), mean_loss, "  lr ", std::setprecision(5),
              lr);
    if (project) acc.log({{"loss", mean_loss}, {"lr", lr}}, epoch);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (project) {
    acc.print("final checkpoint ", acc.save_state().string(), "; metrics in ", (acc.logging_dir() / "digits").string());
    acc.end_training();
  }

  // Evaluation: every rank predicts its shard; gather_for_metrics drops the padding of the even tail.
  net->eval();
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, seen = 0;
  for (const auto& batch : test) {
    const auto hits = acc.gather_for_metrics(at::eq(at::argmax(model(batch.data), 1), batch.target).to(at::kLong));
    correct += hits.sum().item<std::int64_t>();
    seen += hits.size(0);
  }
  acc.print("held-out accuracy ", std::fixed, std::setprecision(2), 100.0 * double(correct) / double(seen), "% over ",
            seen, " samples (the test set has ", n_test, "); training took ", std::setprecision(2), seconds, " s");
  acc.print("parameter checksum ", checksum(*net));
  acc.wait_for_everyone();
  return seen == n_test ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
