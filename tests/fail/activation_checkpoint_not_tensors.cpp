// needs: torch
// expected-error: accel::activation_checkpoint\(fn, args...\): fn must return an at::Tensor, a std::tuple of at::Tensor
#include <accel/model/activation_checkpoint.hpp>
void f(const at::Tensor& x) {
  (void)accel::activation_checkpoint([](const at::Tensor& t) { return t.sum().item<double>(); }, x);
}
