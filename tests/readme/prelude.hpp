#pragma once
// The names a README fragment (a ```cpp fragment block) may use without declaring them: the first example's
// accelerator type and objects, and the few others the README's fragments mention. Declarations only: the blocks are
// compiled with -fsyntax-only (tests/readme/check_blocks.py), never linked or run. A fragment is the body of a
// function, so a name it declares itself hides the one here.
#include <torch/torch.h>
#include <accel/accel.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <tuple>
#include <utility>

// The README's first example.
struct Acc
    : accel::Accelerator<accel::dist::from_env, accel::batches::per_process, accel::tail::even, accel::loading::sharded,
                         accel::rng::sync<accel::rng::generator>, accel::place::device> {};
extern Acc acc;
extern torch::nn::Sequential net;
extern std::shared_ptr<torch::optim::AdamW> adamw;
extern torch::Tensor x, y;
extern accel::data::TensorDataset ds;

namespace readme {
inline auto prepare_all() {
  return acc.prepare(net, adamw, accel::data::DataLoader(accel::data::TensorDataset(x, y), {.batch_size = 16}),
                     std::make_shared<accel::StepLR>(*adamw, 300));
}
using Prepared = decltype(prepare_all());
}  // namespace readme
extern std::tuple_element_t<0, readme::Prepared> model;
extern std::tuple_element_t<1, readme::Prepared> opt;
extern std::tuple_element_t<2, readme::Prepared> loader;
extern std::tuple_element_t<3, readme::Prepared> sched;

// The process of the standalone loader example ("Loading data").
extern accel::ProcessState state;
// Counters of a training loop.
extern std::int64_t epochs, step, total_steps;

// A user's custom state for register_for_checkpointing (checkpoint/custom.hpp: LibTorch's archive protocol).
struct Ema {
  explicit Ema(const torch::nn::Sequential& net);
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
};
