// Collectives (comm/collectives.hpp) without a communicator: one process gathers, reduces and broadcasts to itself.
// The multi-process behaviour is in tests/distributed/comm/collectives.cpp.
#include "../support.hpp"

#include <accel/comm/collectives.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/scalar_tensor.h>
#include <catch2/catch.hpp>

#include <string>

TEST_CASE("one process: every collective works without communicating", "[comm][single]") {
  CHECK(at::equal(accel::gather(nullptr, at::arange(3)), at::arange(3)));
  CHECK(accel::gather(nullptr, at::scalar_tensor(5)).dim() == 1);  // 0-dim becomes 1-dim, also with one process
  CHECK(accel::reduce(nullptr, at::scalar_tensor(2.0), accel::Reduction::mean).item<double>() == 2.0);
  auto b = at::arange(4);
  accel::broadcast(nullptr, b, 0);
  CHECK(at::equal(b, at::arange(4)));
  CHECK(accel::broadcast_object(nullptr, std::string("x")) == "x");
  CHECK((accel::gather_object(nullptr, 7) == std::vector<int>{7}));
  CHECK(at::equal(accel::pad_across_processes(nullptr, at::arange(3)), at::arange(3)));
}
