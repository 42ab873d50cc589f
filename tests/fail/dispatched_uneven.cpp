// expected-error: accel::loading::dispatched always gives every process the same number of batches, so accel::tail::uneven
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::tail::uneven, accel::loading::dispatched> {};
Acc acc;
