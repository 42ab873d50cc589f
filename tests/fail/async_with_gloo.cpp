// flags: -DACCEL_WITH_CUDA=1
// expected-error: accel::place::async copies to a GPU, but accel::dist::gloo keeps tensors on the CPU
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::dist::gloo, accel::place::async>;
Acc acc;
