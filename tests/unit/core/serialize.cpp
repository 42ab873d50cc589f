// Typed serialisation (core/serialize.hpp), the wire format of every object collective.
#include "../support.hpp"

#include <accel/core/serialize.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>

using namespace accel_test;
namespace data = accel::data;

namespace {
struct Record {
  std::string name;
  std::vector<std::optional<double>> values;
  std::tuple<int, std::map<std::string, std::vector<int>>> extra;
};
auto accel_fields(Record& r) { return std::tie(r.name, r.values, r.extra); }
auto accel_fields(const Record& r) { return std::tie(r.name, r.values, r.extra); }
}  // namespace

TEST_CASE("typed serialisation round-trips", "[comm][serialize]") {
  Record in{"metrics", {1.5, std::nullopt, -2.0}, {7, {{"a", {1, 2}}, {"b", {}}}}};
  std::vector<std::uint8_t> bytes;
  accel::serialize(in, bytes);
  Record out;
  std::span<const std::uint8_t> view(bytes);
  accel::deserialize(out, view);
  CHECK(view.empty());
  CHECK(out.name == in.name);
  CHECK((out.values == in.values));
  CHECK((std::get<1>(out.extra) == std::get<1>(in.extra)));
  std::span<const std::uint8_t> truncated(bytes.data(), 5);
  Record bad;
  CHECK_THROWS_WITH(accel::deserialize(bad, truncated), Catch::Contains("truncated"));
}
