// expected-error: accel::loading::dispatched sends rank 0's batches to the other processes, but accel::dist::none has one process
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::loading::dispatched, accel::dist::none> {};
Acc acc;
