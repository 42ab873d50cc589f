// expected-error: accel::loading::dispatched moves every slice to its process's device, so it needs a placement
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::loading::dispatched, accel::place::none>;
Acc acc;
