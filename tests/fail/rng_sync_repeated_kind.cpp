// expected-error: a generator kind is listed twice; list each kind once
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::rng::sync<accel::rng::torch, accel::rng::generator, accel::rng::torch>>;
Acc acc;
