// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::place::async needs CUDA \(pinned memory, copy streams\), but accel is built without it
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::place::async>;
Acc acc;
