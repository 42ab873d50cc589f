// The replicas' fingerprint (model/replicas.hpp): exact on bits, blind to nothing a drift changes.
#include <accel/model/replicas.hpp>

#include <ATen/ops/randn.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

TEST_CASE("replicas: the fingerprint of equal bits is equal; one element one ulp away differs, in every dtype",
          "[replicas]") {
  at::manual_seed(0);
  for (const auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    INFO(c10::toString(dtype));
    const std::vector<at::Tensor> a{at::randn({17, 5}).to(dtype), at::randn({3}).to(dtype), at::randn({}).to(dtype)};
    std::vector<at::Tensor> b;
    for (const auto& t : a) b.push_back(t.clone());
    const at::Tensor fa = accel::replica_fingerprint(a);
    CHECK(fa.sizes() == at::IntArrayRef{3, 2});
    CHECK(fa.scalar_type() == at::kLong);
    CHECK(!accel::compare_replicas({fa, accel::replica_fingerprint(b)}));
    // The next representable value of one element of the second tensor: its bits plus one.
    const auto bits = b[1].element_size() == 8 ? at::kLong : b[1].element_size() == 4 ? at::kInt : at::kShort;
    b[1].view(bits).view({-1}).narrow(0, 1, 1).add_(1);
    CHECK(!b[1].equal(a[1]));
    const auto m = accel::compare_replicas({fa, accel::replica_fingerprint(b), fa});
    REQUIRE(m);
    CHECK(m->row == 1);
    CHECK(m->ranks == std::vector<int>{1});
  }
  // A transposed (non-contiguous) view has the fingerprint of its contiguous copy; one process compares nothing.
  const at::Tensor t = at::randn({4, 6});
  CHECK(!accel::compare_replicas(
      {accel::replica_fingerprint({t.t()}), accel::replica_fingerprint({t.t().contiguous()})}));
  CHECK(!accel::compare_replicas({accel::replica_fingerprint({t})}));
  CHECK(accel::replica_fingerprint({}).size(0) == 0);
}
