// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::place::async needs CUDA \(pinned memory, copy streams\), but accel is built without it
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::place::async> {};
Acc acc;
