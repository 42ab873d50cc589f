// flags: -DACCEL_WITH_CUDA=1
// expected-error: accel::place::async copies to a GPU, but accel::dist::gloo keeps tensors on the CPU
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::dist::gloo, accel::place::async> {};
Acc acc;
