// expected-error: accel::loading::dispatched always gives every process the same number of batches, so accel::tail::uneven
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::tail::uneven, accel::loading::dispatched>;
Acc acc;
