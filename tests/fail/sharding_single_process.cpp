// expected-error: accel::shard::optimizer splits the optimizer state across processes, but accel::dist::none has one process
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::shard::optimizer, accel::dist::none>;
Acc acc;
