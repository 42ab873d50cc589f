// expected-error: accel::loading::dispatched sends rank 0's batches to the other processes, but accel::dist::none has one process
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::loading::dispatched, accel::dist::none>;
Acc acc;
