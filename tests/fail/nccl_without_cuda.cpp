// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::dist::nccl needs CUDA, but accel is built without it \(ACCEL_WITH_CUDA=0\); use accel::dist::gloo
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::dist::nccl>;
Acc acc;
