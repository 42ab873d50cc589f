// expected-error: a generator kind is listed twice; list each kind once
#include <accel/accel.hpp>
struct Acc : accel::Accelerator<accel::rng::sync<accel::rng::torch, accel::rng::generator, accel::rng::torch>> {};
Acc acc;
