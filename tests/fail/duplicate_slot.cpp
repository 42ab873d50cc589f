// expected-error: two policies fill slot 'batching' \(accel::batches::\.\.\.\); keep one
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
using Acc = accel::CheckedConfig<accel::batches::split, accel::dist::gloo, accel::batches::per_process>;
Acc acc;
