// expected-error: a template argument is not an accel policy; use the tags of accel::dist
#include <accel/accel.hpp>
struct MyPolicy {};
struct Acc : accel::Accelerator<accel::dist::gloo, MyPolicy> {};
Acc acc;
