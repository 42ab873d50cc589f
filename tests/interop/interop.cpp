// The C++ side of the interchange tests: files that Python's packages (safetensors, Accelerate, TensorBoard) read
// or wrote. The Python scripts beside this file run it and check what it produced:
//   write FILE                    tensors of every dtype the tests cover, made here (check_safetensors.py makes the
//   same) copy SRC DST                  read_safetensors(SRC), then write_safetensors(DST) with SRC's metadata
//   load-save SRC DST MAX_SHARD   load_model(net, SRC) then save_model(net, DST, MAX_SHARD) for the network of
//                                 check_safetensors.py (its Accelerate save_model output is SRC)
//   map-save SRC DST MAX_SHARD [FROM TO]  save_safetensors_sharded(read_safetensors(SRC), DST, MAX_SHARD), with
//                                 tensor TO, if given, sharing FROM's storage (a tied weight)
//   map-load SRC DST              write_safetensors(DST, load_safetensors_sharded(SRC))
//   track DIR                     a run of every tracker: init_trackers, 10 log calls, end_training
//   track-resume DIR              the same run twice: in DIR/straight uninterrupted, in DIR/resumed stopped after a
//                                 checkpoint (save_state after step 105, then 106..109 logged, no end_training) and
//                                 resumed (load_state, init_trackers, 106..109 again)
#include <accel/accelerator.hpp>
#include <accel/checkpoint/safetensors.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <iostream>
#include <string>

namespace ck = accel::checkpoint;

namespace {

// (arange(12) - 5) / 4 as a 3x4 tensor: exact in every floating dtype, so Python can make the same values.
ck::TensorMap made_tensors() {
  const auto base = at::arange(12, at::kFloat).sub(5).div(4).reshape({3, 4});
  return {{"f32", base},
          {"f16", base.to(at::kHalf)},
          {"bf16", base.to(at::kBFloat16)},
          {"f64", base.to(at::kDouble).t()},
          {"i64", at::arange(-3, 3, at::kLong).reshape({2, 3})},
          {"i32", at::arange(5, at::kInt).mul(1000)},
          {"u8", at::arange(250, 256).to(at::kByte)},
          {"bool", base.gt(0)},
          {"scalar", at::scalar_tensor(3.5, at::kFloat)},
          {"scalar_i64", at::scalar_tensor(-7, at::kLong)},
          {"empty", at::empty({0, 3})},
          {"empty_bf16", at::empty({2, 0}, at::kBFloat16)}};
}

torch::nn::Sequential net() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 64), torch::nn::Linear(64, 4));
}

struct Solo : accel::Accelerator<accel::dist::none> {};

void track(const std::string& dir) {
  namespace tr = accel::tracking;
  Solo acc{
      accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard}, .logging_dir = dir}};
  acc.init_trackers("run", {{"lr", 0.1}, {"batch_size", 32}, {"optimizer", "adamw"}});
  for (int s = 0; s < 10; ++s) {
    tr::Values v{{"loss", 1.0 / (s + 1)}, {"lr", 0.1 * std::pow(0.5, s)}};
    if (s % 3 == 0) v["epoch"] = std::int64_t(s / 3);
    if (s == 4) v["phase"] = "warm, \"done\"";
    acc.log(v, 100 + s);
  }
  acc.end_training();
}

// Step s's values for track-resume: scalars, a text before the checkpoint (104) and one after it (107).
accel::tracking::Values resume_values(int s) {
  accel::tracking::Values v{{"loss", 1.0 / (s + 1)}, {"lr", 0.1 * std::pow(0.5, s)}};
  if (s == 4) v["phase"] = "warm";
  if (s == 7) v["note"] = "after the checkpoint";
  return v;
}

void track_resume(const std::string& dir) {
  namespace tr = accel::tracking;
  const tr::Values config{{"lr", 0.1}, {"optimizer", "adamw"}};
  auto options = [&](const char* run) {
    return accel::Options{.log_with = {tr::Tracker::jsonl, tr::Tracker::csv, tr::Tracker::tensorboard},
                          .logging_dir = dir + "/" + run};
  };
  {
    Solo acc{options("straight")};
    acc.init_trackers("run", config);
    for (int s = 0; s < 10; ++s) acc.log(resume_values(s), 100 + s);
    acc.end_training();
  }
  {
    Solo acc{options("resumed")};
    acc.init_trackers("run", config);
    for (int s = 0; s < 10; ++s) {
      acc.log(resume_values(s), 100 + s);
      if (s == 5) acc.save_state(dir + "/checkpoint");
    }
  }
  Solo acc{options("resumed")};
  acc.load_state(dir + "/checkpoint");
  acc.init_trackers("run", config);
  for (int s = 6; s < 10; ++s) acc.log(resume_values(s), 100 + s);
  acc.end_training();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "write" && argc == 3) {
      ck::write_safetensors(argv[2], made_tensors());
    } else if (mode == "copy" && argc == 4) {
      ck::write_safetensors(argv[3], ck::read_safetensors(argv[2]), ck::read_safetensors_metadata(argv[2]));
    } else if (mode == "load-save" && argc == 5) {
      auto n = net();
      ck::load_model(*n, argv[2]);
      ck::save_model(*n, argv[3], {.max_shard_size = ck::parse_size(argv[4])});
    } else if (mode == "map-save" && (argc == 5 || argc == 7)) {
      auto tensors = ck::read_safetensors(argv[2]);
      if (argc == 7) tensors[argv[6]] = tensors.at(argv[5]);
      ck::save_safetensors_sharded(tensors, argv[3], {.max_shard_size = ck::parse_size(argv[4])});
    } else if (mode == "map-load" && argc == 4) {
      ck::write_safetensors(argv[3], ck::load_safetensors_sharded(argv[2]));
    } else if (mode == "track" && argc == 3) {
      track(argv[2]);
    } else if (mode == "track-resume" && argc == 3) {
      track_resume(argv[2]);
    } else {
      std::cerr << "usage: accel_interop_tests write FILE | copy SRC DST | load-save SRC DST MAX_SHARD | "
                   "map-save SRC DST MAX_SHARD [FROM TO] | map-load SRC DST | track DIR | track-resume DIR\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
