// expected-error: two policies fill slot 'rng' .*list every kind in one accel::rng::sync<\.\.\.>
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::rng::sync<accel::rng::torch>, accel::rng::sync<accel::rng::generator>>;
Acc acc;
