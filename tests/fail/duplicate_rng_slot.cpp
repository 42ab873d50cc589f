// expected-error: two policies fill slot 'rng' .*list every kind in one accel::rng::sync<\.\.\.>
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::rng::sync<accel::rng::torch>, accel::rng::sync<accel::rng::generator>> {};
Acc acc;
