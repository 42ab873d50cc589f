// Includes the umbrella header, resolves a configuration and runs a sharding plan with LibTorch's RNG.
#include <accel/accel.hpp>
#include <accel/plan/plan.hpp>
#include <accel/data/sampler.hpp>

#include <ATen/Context.h>

#include <iostream>

struct Acc : accel::Accelerator<accel::dist::gloo, accel::batches::split> {};

int main() {
  static_assert(Acc::config::split_batches);
  at::manual_seed(0);
  accel::data::ShuffledOrders orders(10, 2, accel::data::Shuffle::seedable, 42);
  const auto order = orders.next(0);
  const auto plan = accel::plan::loader_plan({.batch_size = 4, .num_processes = 2, .split_batches = true}, 10,
                                             accel::plan::Loading::sharded);
  std::cout << "accel test_package: " << plan.size() << " batches, first index " << order[plan.sample(0)]
            << ", ACCEL_WITH_CUDA=" << ACCEL_WITH_CUDA << "\n";
  return plan.size() == 3 ? 0 : 1;
}
