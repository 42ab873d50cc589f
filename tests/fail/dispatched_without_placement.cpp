// expected-error: accel::loading::dispatched moves every slice to its process's device, so it needs a placement
#include <accel/accel.hpp>
struct Acc : accel::Accelerator<accel::loading::dispatched, accel::place::none> {};
Acc acc;
