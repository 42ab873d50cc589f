// expected-error: a template argument is not an accel policy; use the tags of accel::dist
#include <accel/accelerator.hpp>  // where the configuration diagnostics live (accel.hpp includes it)
struct MyPolicy {};
struct Acc : accel::Accelerator<accel::dist::gloo, MyPolicy> {};
Acc acc;
