// needs: torch
// expected-error: this scheduler steps with a metric \(ReduceLROnPlateau\): call step\(metric\)
#include <accel/optim/schedulers.hpp>
void f(accel::AcceleratedScheduler<accel::ReduceLROnPlateau>& sched) { sched.step(); }
