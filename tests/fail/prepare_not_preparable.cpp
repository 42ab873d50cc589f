// needs: torch
// expected-error: accel::Accelerator::prepare: an argument is neither a model .* nor a scheduler
#include <torch/optim/sgd.h>
#include <accel/accelerator.hpp>
struct Acc : accel::Accelerator<accel::dist::none> {};
void f(Acc& acc) {
  struct NotATrainingObject {};
  auto [a, b] =
      acc.prepare(std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{}, torch::optim::SGDOptions(0.1)),
                  NotATrainingObject{});
}
