// expected-error: accel::loading::dispatched samples on rank 0 only, so accel::rng::generator has nothing to synchronise
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::loading::dispatched, accel::rng::sync<accel::rng::generator>> {};
Acc acc;
