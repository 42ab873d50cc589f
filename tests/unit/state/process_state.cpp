// ProcessState (state/process_state.hpp) with one process: every query and helper works without communicating;
// dist::none under a multi-process launch is refused.
#include "../support.hpp"

#include <accel/state/process_state.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <string>

namespace {
accel::EnvLookup environment(std::map<std::string, std::string> env) {
  return [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

TEST_CASE("one process: the state works without communicating", "[state][single]") {
  accel::ProcessState::reset();
  accel::ProcessOptions opt;
  opt.env = environment({});
  accel::ProcessState s(opt);
  CHECK(s.num_processes() == 1);
  CHECK((s.is_main_process() && s.is_local_main_process() && s.is_last_process()));
  CHECK(s.distributed_type() == accel::DistributedType::no);
  CHECK(s.comm() == nullptr);
  CHECK(!s.use_distributed());
  s.wait_for_everyone();
  { auto first = s.main_process_first(); }
  CHECK(s.on_main_process([] {}));
  CHECK(s.on_last_process([] { return 3; }) == std::optional<int>(3));
  CHECK(s.on_local_process(0, [] { return std::string("local"); }) == std::optional<std::string>("local"));
  CHECK_THROWS_WITH(s.on_process(2, [] {}), Catch::Contains("process index 2 is out of range: this job has 1 process"));
  std::vector<int> v{1, 2, 3};
  CHECK((s.split_between_processes(v, true) == v));  // one process gets everything, no padding
  CHECK(at::equal(s.split_between_processes(at::arange(5), true), at::arange(5)));
  // dist::none with a multi-process launch is refused.
  accel::ProcessState::reset();
  accel::ProcessOptions two;
  two.env = environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}});
  CHECK_THROWS_WITH(accel::ProcessState(two, accel::dist::none{}),
                    Catch::Contains("dist::none runs one process, but the launcher started 2"));
  accel::ProcessState::reset();
}
