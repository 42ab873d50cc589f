// needs: torch
// expected-error: accel::Checkpointed<M>: M must have one non-template forward member function
#include <accel/model/activation_checkpoint.hpp>

#include <torch/nn/modules/container/modulelist.h>
void f() { (void)accel::Checkpointed(torch::nn::ModuleList()); }
