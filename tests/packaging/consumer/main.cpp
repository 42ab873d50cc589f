#include <accel/accel.hpp>
#include <accel/plan/plan.hpp>

#include <iostream>

struct Acc : accel::Accelerator<accel::dist::gloo, accel::tail::uneven> {};

int main() {
  static_assert(!Acc::config::even_batches);
  const auto plan = accel::plan::loader_plan(
      {.batch_size = 3, .num_processes = 2, .process_index = 1, .even_batches = Acc::config::even_batches}, 10,
      accel::plan::Loading::sharded);
  std::cout << "accel consumer: rank 1 gets " << plan.size() << " batches (ACCEL_WITH_CUDA=" << ACCEL_WITH_CUDA
            << ")\n";
  return plan.size() == 2 ? 0 : 1;
}
