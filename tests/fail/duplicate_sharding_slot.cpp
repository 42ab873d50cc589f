// expected-error: two policies fill slot 'sharding' \(accel::shard::\.\.\.\); keep one
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::shard::optimizer, accel::dist::gloo, accel::shard::none>;
Acc acc;
