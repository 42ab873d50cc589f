// expected-error: accel::shard::parameters gathers each unit's parameters from every process inside the forward, which a process out of batches under accel::tail::uneven does not run
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::dist::gloo, accel::shard::parameters, accel::tail::uneven>;
Acc acc;
