// needs: torch
// expected-error: an optimizer cannot be copied; pass it as std::shared_ptr .* or by std::move
#include <accel/accelerator.hpp>
#include <torch/optim/sgd.h>
struct Acc : accel::Accelerator<accel::dist::none> {};
void f(Acc& acc, torch::optim::SGD& sgd) { auto opt = acc.prepare(sgd); }
