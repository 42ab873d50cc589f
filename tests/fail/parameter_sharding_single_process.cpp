// expected-error: accel::shard::parameters splits the parameters, gradients and optimizer state across processes, but accel::dist::none has one process
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::dist::none, accel::shard::parameters>;
Acc acc;
