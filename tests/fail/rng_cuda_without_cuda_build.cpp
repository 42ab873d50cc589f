// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::rng::cuda needs CUDA, but accel is built without it
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::dist::from_env, accel::rng::sync<accel::rng::cuda>>;
Acc acc;
