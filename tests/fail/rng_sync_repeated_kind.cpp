// expected-error: a generator kind is listed twice; list each kind once
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::rng::sync<accel::rng::torch, accel::rng::generator, accel::rng::torch>> {};
Acc acc;
