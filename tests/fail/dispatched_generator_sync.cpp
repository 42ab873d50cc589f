// expected-error: accel::loading::dispatched samples on rank 0 only, so accel::rng::generator has nothing to synchronise
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::loading::dispatched, accel::rng::sync<accel::rng::generator>>;
Acc acc;
