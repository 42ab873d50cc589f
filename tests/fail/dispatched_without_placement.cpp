// expected-error: accel::loading::dispatched moves every slice to its process's device, so it needs a placement
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::loading::dispatched, accel::place::none> {};
Acc acc;
