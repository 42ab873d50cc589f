// needs: torch
// expected-error: an optimizer cannot be copied; pass it as std::shared_ptr .* or by std::move
#include <torch/optim/sgd.h>
#include <accel/accelerator.hpp>
struct Acc : accel::Accelerator<accel::dist::none> {};
void f(Acc& acc, torch::optim::SGD& sgd) { auto opt = acc.prepare(sgd); }
