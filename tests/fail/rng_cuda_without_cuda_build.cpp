// flags: -DACCEL_WITH_CUDA=0
// expected-error: accel::rng::cuda needs CUDA, but accel is built without it
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct Acc : accel::Accelerator<accel::dist::from_env, accel::rng::sync<accel::rng::cuda>> {};
Acc acc;
