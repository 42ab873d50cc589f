// needs: torch
// expected-error: accel::loading::dispatched sends rank 0's batches to the other processes, but accel::dist::none
#include <accel/accelerator.hpp>
struct Acc : accel::Accelerator<accel::dist::none, accel::loading::dispatched> {};
Acc acc;
