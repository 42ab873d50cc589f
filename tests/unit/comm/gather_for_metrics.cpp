// gather_for_metrics (comm/collectives.hpp) with one process: the padding the layout marks is dropped; a layout of
// another world size is refused. The multi-process behaviour is in tests/distributed/comm/gather_for_metrics.cpp.
#include "../support.hpp"

#include <accel/comm/collectives.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

TEST_CASE("one process: gather_for_metrics drops the padding the layout marks", "[comm][gather_for_metrics]") {
  CHECK(at::equal(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4}, .real = {3}}), at::arange(3)));
  CHECK(at::equal(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4}, .real = {4}}), at::arange(4)));
  CHECK_THROWS_WITH(accel::gather_for_metrics(nullptr, at::arange(4), {.size = {4, 4}, .real = {4, 4}}),
                    Catch::Contains("the layout describes 2 ranks, the job has 1"));
}

TEST_CASE("one process: gather_for_metrics of objects drops the padding the layout marks",
          "[comm][gather_for_metrics]") {
  const std::vector<std::string> batch{"a", "b", "c", "a"};
  CHECK((accel::gather_for_metrics(nullptr, batch, {.size = {4}, .real = {3}}) ==
         std::vector<std::string>{"a", "b", "c"}));
  CHECK((accel::gather_for_metrics(nullptr, batch, {.size = {4}, .real = {4}}) == batch));
  CHECK(accel::gather_for_metrics(nullptr, std::vector<int>{}, {.size = {0}, .real = {0}}).empty());
  CHECK_THROWS_WITH(accel::gather_for_metrics(nullptr, batch, {.size = {4, 4}, .real = {4, 4}}),
                    Catch::Contains("the layout describes 2 ranks, the job has 1"));
  CHECK_THROWS_WITH(
      accel::gather_for_metrics(nullptr, batch, {.size = {5}, .real = {5}}),
      Catch::Contains("rank 0 passes 4 objects but its batch has 5; pass one object per sample of the batch"));
}
