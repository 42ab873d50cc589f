// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::dist::nccl needs CUDA, but accel is built without it \(ACCEL_WITH_CUDA=0\); use accel::dist::gloo
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::dist::nccl> {};
Acc acc;
