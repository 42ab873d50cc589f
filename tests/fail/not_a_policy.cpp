// expected-error: a template argument is not an accel policy; use the tags of accel::dist
#include <accel/config.hpp>  // where the configuration diagnostics live (Accelerator<...>::config names them)
struct MyPolicy {};
using Acc = accel::CheckedConfig<accel::dist::gloo, MyPolicy>;
Acc acc;
