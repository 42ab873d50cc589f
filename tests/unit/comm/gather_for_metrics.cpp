// gather_for_metrics (comm/collectives.hpp) with one process: the padding the layout marks is dropped; a layout of
// another world size is refused. The multi-process behaviour is in tests/distributed/comm/gather_for_metrics.cpp.
#include "../support.hpp"

#include <accel/comm/collectives.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <catch2/catch.hpp>

TEST_CASE("one process: gather_for_metrics drops the padding the layout marks", "[comm][gather_for_metrics]") {
  CHECK(at::equal(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4}, .real = {3}}), at::arange(3)));
  CHECK(at::equal(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4}, .real = {4}}), at::arange(4)));
  CHECK_THROWS_WITH(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4, 4}, .real = {4, 4}}),
                    Catch::Contains("the layout describes 2 ranks, the job has 1"));
}
