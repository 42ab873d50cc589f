// flags: -DACCEL_WITH_CUDA=1
// expected-error: accel::rng::cuda synchronises GPU generators, but the distributed policy is a CPU one
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::rng::sync<accel::rng::generator, accel::rng::cuda>, accel::dist::gloo>;
Acc acc;
