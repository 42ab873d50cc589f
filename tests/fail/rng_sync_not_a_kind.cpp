// expected-error: accel::rng::sync<\.\.\.>: every argument must be accel::rng::torch, accel::rng::cuda or accel::rng::generator
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::rng::sync<accel::dist::gloo>> {};
Acc acc;
