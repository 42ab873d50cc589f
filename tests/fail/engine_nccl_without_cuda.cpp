// needs: torch
// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::dist::nccl needs CUDA, but accel is built without it \(ACCEL_WITH_CUDA=0\); use accel::dist::gloo
// The same without an Accelerator: the engine's own specialisation is missing, and says so once.
#include <accel/state/process_state.hpp>
accel::ProcessState state(accel::ProcessOptions{}, accel::dist::nccl{});
