// needs: torch
// expected-error: accel::shard::optimizer shards optimizers whose state is per parameter
#include <torch/optim/lbfgs.h>
#include <accel/accelerator.hpp>
struct Acc : accel::Accelerator<accel::dist::gloo, accel::shard::optimizer> {};
void f(Acc& acc, std::shared_ptr<torch::optim::LBFGS> lbfgs) { auto opt = acc.prepare(lbfgs); }
