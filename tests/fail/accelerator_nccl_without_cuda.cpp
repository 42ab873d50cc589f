// needs: torch
// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::dist::nccl needs CUDA, but accel is built without it \(ACCEL_WITH_CUDA=0\); use accel::dist::gloo
// The engine is chosen by type: an Accelerator whose policy needs an engine this build lacks stops the build once.
#include <accel/accelerator.hpp>
struct Acc : accel::Accelerator<accel::dist::nccl> {};
Acc acc;
