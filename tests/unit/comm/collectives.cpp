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

TEST_CASE("CollectiveId: what every rank must agree on, described, published and fingerprinted", "[comm][check]") {
  using accel::comm::CollectiveId;
  using accel::comm::OpKind;
  using accel::comm::ReduceOp;
  const CollectiveId reduce{12, OpKind::all_reduce, ReduceOp::max, c10::ScalarType::Float, 4, 0};
  CHECK(reduce.describe() == "all_reduce(max) of 4 x Float");
  CHECK(CollectiveId{3, OpKind::broadcast, ReduceOp::sum, c10::ScalarType::Long, 7, 2}.describe() ==
        "broadcast from rank 2 of 7 x Long");
  CHECK(CollectiveId{5, OpKind::barrier}.describe() == "barrier");
  // The heartbeat publishes it as text; a garbled entry is not an operation.
  const auto back = CollectiveId::decode(reduce.encode());
  REQUIRE(back);
  CHECK(*back == reduce);
  CHECK(!CollectiveId::decode("12 9 0 6 4 0"));
  CHECK(!CollectiveId::decode("twelve"));
  // Every field changes the fingerprint; the unchecked collectives before it do too, but not the operation.
  std::vector<CollectiveId> others(6, reduce);
  others[0].seq = 13, others[1].kind = OpKind::all_gather, others[2].reduce = ReduceOp::sum;
  others[3].dtype = c10::ScalarType::Double, others[4].numel = 5, others[5].root = 1;
  for (const auto& o : others) {
    CHECK(!(o == reduce));
    CHECK(o.fingerprint() != reduce.fingerprint());
  }
  CollectiveId carried = reduce;
  carried.unchecked = 0x1234, carried.unchecked_from = 10;
  CHECK(carried == reduce);
  CHECK(carried.fingerprint() != reduce.fingerprint());
}
