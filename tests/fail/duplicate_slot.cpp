// expected-error: two policies fill slot 'batching' \(accel::batches::\.\.\.\); keep one
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::batches::split, accel::dist::gloo, accel::batches::per_process> {};
Acc acc;
