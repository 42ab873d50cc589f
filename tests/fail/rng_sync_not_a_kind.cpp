// expected-error: accel::rng::sync<\.\.\.>: every argument must be accel::rng::torch, accel::rng::cuda or accel::rng::generator
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::rng::sync<accel::dist::gloo>>;
Acc acc;
